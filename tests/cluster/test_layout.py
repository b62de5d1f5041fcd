"""`tandem serve`'s default layout: chosen for the machines unless the spec or a flag names one."""

from __future__ import annotations

from cluster.cli import parse_args, spec_from_args
from cluster.layout import Machines, choose_layout

ONE_CPU_MACHINE = Machines(nodes=1, local_cpus=2, gpus=0)


def _layout(*flags: str, machines: Machines = ONE_CPU_MACHINE):
    return choose_layout(spec_from_args(parse_args(["serve", *flags])), machines)


def test_one_machine_without_gpus_gets_one_colocated_worker_on_every_core():
    spec, why = _layout("--dtype", "float32", "--max-num-seqs", "64")  # not layout fields
    assert (spec.prefill.replicas, spec.decode.replicas, spec.decode.torch_threads) == (0, 1, 2)
    assert spec.decode.dtype == "float32" and spec.engine.max_num_seqs == 64
    assert "1 worker that prefills and decodes on all 2 cores" in why


def test_gpus_or_several_nodes_keep_the_separate_pools():
    for machines in (Machines(1, 16, gpus=1), Machines(3, 16, gpus=0)):
        spec, why = _layout(machines=machines)
        assert (spec.prefill.replicas, spec.decode.replicas, spec.decode.torch_threads) == (1, 1, 1)
        assert "separate pools" in why


def test_a_layout_named_by_a_flag_or_a_spec_file_is_kept(tmp_path):
    spec, why = _layout("--num-prefill", "1")
    assert (spec.prefill.replicas, spec.decode.torch_threads) == (1, 1) and why.endswith("as configured")
    spec, _ = _layout("--torch-threads", "2")
    assert (spec.prefill.replicas, spec.decode.torch_threads) == (1, 2)
    path = tmp_path / "spec.yaml"
    path.write_text("decode: {replicas: 2}\n")
    spec, _ = _layout("--config", str(path))
    assert (spec.prefill.replicas, spec.decode.replicas) == (1, 2)

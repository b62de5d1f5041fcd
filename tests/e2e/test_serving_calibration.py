"""The serving calibration's `beside` phase through a real deployment: 1 prefill + 1 decode worker of a tiny
model, one round of a stream decoding, probes sent beside it, then their quiet twins, each with the prefill time the
prefill worker measured."""

from __future__ import annotations

from cluster import calibration_beside as beside
from cluster.spec import with_overrides
from tests.tiny_models import VOCAB_SIZE

SMALL = beside.BesideProbes(rounds=1, stream_prompt=48, stream_output=400, probes=(16, 160), quiet_s=0.3)


def test_a_round_sends_a_stream_its_probes_and_their_quiet_twins(ray_session, tiny_model_dirs):
    spec = with_overrides(beside.beside_spec(tiny_model_dirs["llama"], threads=1, replicas=2),
                          {"engine.num_kv_blocks": 128, "engine.max_model_len": 512})  # fmt: skip
    (round_,) = beside.beside_phase(spec, VOCAB_SIZE, SMALL, on_progress=lambda what: None)
    assert round_.stream.success and round_.stream.itl  # (a tiny model's 400 tokens may end before the probes)
    assert [o.prompt_len for o in round_.beside] == [o.prompt_len for o in round_.quiet] == [16, 160]
    for probe in round_.beside + round_.quiet:  # each prefilled by the prefill worker, which reported its time
        assert probe.success and probe.phases["prefill_s"] > 0 and probe.prefill_window()
    line = beside.prompt_contention([round_])
    assert set(line) == {"prompt_contention_s", "prompt_contention_per_token_s"} and min(line.values()) >= 0

"""The performance model: what a step, a KV transfer and serving around them cost, for one kind of worker.

A leaf (no torch, nothing else of Tandem's): the router may price a request with it; `planner` fits it
from measured steps (`tandem profile`) and derives it from published device figures (`devices`), and
its simulator runs Tandem's own scheduler on the time it predicts.
"""

from costmodel.devices import DEVICES, DeviceFigures, device_figures, published_profile
from costmodel.model_dims import ModelDims
from costmodel.profile import FitReport, Profile
from costmodel.serving_cost import Neighbours, ServingCost
from costmodel.step_cost import StepCost
from costmodel.step_shape import StepShape, chunk_attention_pairs
from costmodel.transfer_cost import TransferCost

__all__ = ["DEVICES", "DeviceFigures", "FitReport", "ModelDims", "Neighbours", "Profile", "ServingCost", "StepCost",
           "StepShape", "TransferCost", "chunk_attention_pairs", "device_figures", "published_profile"]

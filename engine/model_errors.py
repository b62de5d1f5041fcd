"""Errors of model resolution, shared by the local, GGUF and hub paths."""


class ModelNotFoundError(FileNotFoundError):
    """The model could not be found locally, in the HF cache or on the hub."""


class ModelConversionError(RuntimeError):
    """A GGUF file could not be turned into a safetensors model directory."""

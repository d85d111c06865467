"""Errors the core raises, each carrying a message a person can act on."""


class FitScopeError(Exception):
    """Base class: str(error) is a complete sentence shown to the user as is."""


class ModelFileError(FitScopeError):
    """A model file (GGUF or config.json) cannot be read or understood."""


class CatalogError(FitScopeError):
    """A catalog file is missing or invalid, or an id is not in it."""


class EstimateError(FitScopeError):
    """The requested settings are impossible (as llama.cpp would refuse them)."""

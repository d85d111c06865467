"""FitScope: will this language model run on this machine, and how fast?"""

__version__ = "0.1.0"

"""ncclforensics: explain failed distributed PyTorch runs from their logs."""

__version__ = "0.1.0"

"""Which files of a run folder are not logs: scripts, configs, documents, data files beside them."""

from __future__ import annotations

# Their text (`torch.save(...)` in a training script) would pass for evidence. Named explicitly, a
# file is always read.
NOT_LOG_SUFFIXES = (
    ".py", ".pyc", ".ipynb", ".md", ".rst", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".sh", ".sbatch",
    ".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".so", ".o", ".a", ".whl", ".pt", ".pth", ".ckpt", ".bin",
    ".safetensors", ".npy", ".npz", ".parquet", ".png", ".jpg", ".jpeg", ".gif", ".svg", ".pdf",
    ".html", ".htm", ".css", ".js", ".lock",
)

NOT_A_LOG = "not a log (script, config, document or data file)"
# Documents among them that may be pasted console output (an issue body saved as issue.md): read when
# a folder holds nothing else.
DOC_SUFFIXES = (".md", ".rst")

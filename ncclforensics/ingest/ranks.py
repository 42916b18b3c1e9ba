"""Global ranks for rows that do not state theirs (FORMATS.md §2.1): from lines, pids, local ranks, srun, NCCL."""

from __future__ import annotations

import re

import polars as pl

from ncclforensics.model import extra_field
from ncclforensics.vocabulary import vocabulary

# A path naming one process (Slurm `-o %t` task files, `rank3.log`, `worker-3.err`: FORMATS.md §2.2)
_PER_PROCESS = re.compile(r"(?:^|[/_.\-])(?:task|worker|proc|rank)[_\-]?\d+(?:[/_.\-]|$)", re.I)


def _single_writer_files(df: pl.DataFrame) -> pl.DataFrame:
    """A file that one process wrote (srun -o %t, a job's task-N/output.txt): every line that names
    its rank names the same one, there is at most one local rank and one pid, and no launcher line
    (a console of several workers has torchrun's). Its lines without a rank are that rank's.

    One rank-bearing line in a console is not enough: a pasted excerpt often shows one rank's error
    beside the main process's unprefixed lines (MISSES G18). The file must name one process in its
    path, or carry that rank on two or more lines."""
    launcher = (pl.col("extra").str.contains('"agent": true').fill_null(False)
                | pl.col("kind").cast(pl.Utf8).is_in(list(vocabulary().kinds_from_launcher())))
    one = (df.group_by("file")
           .agg(pl.col("rank").drop_nulls().n_unique().alias("_nr"), pl.col("rank").drop_nulls().first().alias("_r1"),
                pl.col("line").filter(pl.col("rank").is_not_null()).n_unique().alias("_lines"),
                pl.col("local_rank").drop_nulls().n_unique().alias("_nl"),
                pl.col("pid").drop_nulls().n_unique().alias("_np"), launcher.any().alias("_launch"))
           .filter((pl.col("_nr") == 1) & (pl.col("_nl") <= 1) & (pl.col("_np") <= 1) & ~pl.col("_launch")
                   & ((pl.col("_lines") >= 2) | pl.col("file").str.contains(_PER_PROCESS.pattern)))
           .select("file", "_r1"))
    if one.is_empty():
        return df
    df = df.join(one, on="file", how="left", maintain_order="left")
    own = pl.col("source") != "kernel"
    return df.with_columns(pl.when(own).then(pl.coalesce("rank", "_r1")).otherwise(pl.col("rank"))
                           .alias("rank")).drop("_r1")


def _map_rank(df: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Fill `rank` from rows with the same `keys` that name exactly one rank."""
    known = (df.filter(pl.col("rank").is_not_null() & pl.all_horizontal(pl.col(k).is_not_null() for k in keys))
             .group_by(keys).agg(pl.col("rank").n_unique().alias("_n"), pl.col("rank").first().alias("_r"))
             .filter(pl.col("_n") == 1).drop("_n"))
    df = df.join(known, on=keys, how="left", maintain_order="left")
    return df.with_columns(pl.coalesce("rank", "_r").alias("rank")).drop("_r")


def _rank_from(df: pl.DataFrame, candidate: pl.Expr, *, allowed: bool = True,
               unchecked: bool = False) -> pl.DataFrame:
    """Fill `rank` from `candidate` where it is missing, if allowed and if every row that has both
    agrees (and at least one does, unless `unchecked`): a source of ranks is trusted only once it
    is seen to be right."""
    df = df.with_columns(candidate.alias("_cand"))
    both = df.filter(pl.col("rank").is_not_null() & pl.col("_cand").is_not_null())
    if allowed and (both.height or unchecked) and (both["rank"] == both["_cand"]).all():
        df = df.with_columns(pl.coalesce("rank", "_cand").alias("rank"))
    return df.drop("_cand")


def _srun_ranks(df: pl.DataFrame) -> pl.DataFrame:
    """Slurm task ids as global ranks, when Slurm started one task per GPU (FORMATS.md §1.7).

    Then no torchrun runs inside (no agent lines, no `[default<n>]:` local ranks) and every line that
    states its global rank agrees with its `srun --label` task id; with one torchrun per node the
    task id is the node index and this does nothing.
    """
    task = pl.coalesce(
        extra_field("srun_task"),
        pl.when(pl.col("kind") == "srun_task_exit").then(extra_field("task")),
    ).cast(pl.Int64, strict=False)
    launched = df.filter((pl.col("source") == "torchrun") | pl.col("local_rank").is_not_null()).height
    # with no torchrun line at all, srun started the workers themselves: the label is the rank even
    # where no line also states its rank to check it against
    return _rank_from(df, task, allowed=not launched, unchecked=True)


def _nccl_world_ranks(df: pl.DataFrame) -> pl.DataFrame:
    """NCCL init lines of the world communicator name global ranks (FORMATS.md §2.1, item 6).

    The world communicator is the largest one; its NCCL ranks are trusted as global ranks only when
    every such line that also states its global rank (a `[rank<n>]` prefix, a pid mapped to a rank)
    agrees, and when it is at least as large as the ranks seen.
    """
    nranks = extra_field("nranks").cast(pl.Int64, strict=False)
    is_init = pl.col("kind") == "nccl_init"
    world = df.filter(is_init).select(nranks.max()).item() if df.height else None
    if world is None:
        return df
    nccl_rank = extra_field("nccl_rank").cast(pl.Int64, strict=False)
    cand = pl.when(is_init & (nranks == world)).then(nccl_rank)
    # With no line to check them against (per-process NCCL_DEBUG_FILEs, no rank prefixes), they are
    # still trusted when each process has one world-sized communicator rank and no two processes
    # share one: a second communicator of that size with the ranks in another order would not pass.
    inits = (df.filter(is_init & (nranks == world) & pl.col("pid").is_not_null())
             .select("host", "pid", nccl_rank.alias("r")).drop_nulls("r").unique())
    unchecked = bool(inits.height) and (inits.group_by("host", "pid").len()["len"].max() == 1
                                        and inits["r"].n_unique() == inits.height)
    return _rank_from(df, cand, allowed=world >= df["rank"].drop_nulls().n_unique(), unchecked=unchecked)


def _tabled_ranks(df: pl.DataFrame) -> pl.DataFrame:
    """A launcher's table of the workers it started (Ray Train's, patterns/signatures/launcher/worker_table.toml)
    names each worker's host, pid and rank: a row of that pid on that host (or of a pid no two listed workers
    share, for a line whose prefix names no host) without a rank is that worker's."""
    if not (df["kind"] == "worker_table").any():
        return df
    x = pl.col("extra")
    table = (df.filter(pl.col("kind") == "worker_table")
             .select(x.str.json_path_match("$.worker_host").alias("_th"),
                     x.str.json_path_match("$.worker_pid").cast(pl.Int64, strict=False).alias("pid"),
                     x.str.json_path_match("$.worker_rank").cast(pl.Int32, strict=False).alias("_tr"))
             .drop_nulls(["pid", "_tr"]).unique())
    by_host = (table.drop_nulls("_th").group_by("_th", "pid")
               .agg(pl.col("_tr").n_unique().alias("_n"), pl.col("_tr").first())
               .filter(pl.col("_n") == 1).drop("_n").rename({"_th": "host"}))
    by_pid = (table.group_by("pid").agg(pl.col("_tr").n_unique().alias("_n"), pl.col("_tr").first().alias("_tp"))
              .filter(pl.col("_n") == 1).drop("_n"))
    df = (df.join(by_host, on=["host", "pid"], how="left", maintain_order="left")
          .join(by_pid, on="pid", how="left", maintain_order="left"))
    own = pl.col("kind") != "worker_table"
    fill = pl.when(pl.col("host").is_not_null()).then(pl.col("_tr")).otherwise(pl.col("_tp"))
    return df.with_columns(pl.when(own).then(pl.coalesce("rank", fill)).otherwise(pl.col("rank"))
                           .cast(pl.Int32).alias("rank")).drop("_tr", "_tp")


def _line_ranks(df: pl.DataFrame) -> pl.DataFrame:
    """A line that names its rank names it for every event on it: `[Rank 2] NCCL watchdog thread
    terminated with exception: CUDA error: …` is rank 2's CUDA error too (FORMATS.md §3.8)."""
    named = (df.filter(pl.col("rank").is_not_null()).group_by("file", "line")
             .agg(pl.col("rank").n_unique().alias("_n"), pl.col("rank").first().alias("_lr"))
             .filter(pl.col("_n") == 1).drop("_n"))
    if named.is_empty():
        return df
    df = df.join(named, on=["file", "line"], how="left", maintain_order="left")
    return df.with_columns(pl.coalesce("rank", "_lr").alias("rank")).drop("_lr")


def _node_offsets(df: pl.DataFrame) -> pl.DataFrame:
    """torchrun gives a node's local ranks consecutive global ranks (`global_ranks=[8, …, 15]`,
    FORMATS.md §8.1): where every known (local rank, rank) pair of a torchrun node (a --log-dir
    tree's attempt_N/<local_rank>/ files) differs by one offset, a file of that node whose lines carry
    no rank prefix (a busy rank's stdout.log) gets local rank + offset."""
    tree = pl.col("extra").str.contains('"attempt"').fill_null(False)
    known = (df.filter(tree & pl.col("rank").is_not_null() & pl.col("local_rank").is_not_null())
             .group_by("_at").agg((pl.col("rank") - pl.col("local_rank")).unique().alias("_offs"))
             .filter(pl.col("_offs").list.len() == 1)
             .select("_at", pl.col("_offs").list.first().alias("_off")))
    if known.is_empty():
        return df
    df = df.join(known, on="_at", how="left", maintain_order="left")
    fill = tree & pl.col("rank").is_null() & pl.col("local_rank").is_not_null() & pl.col("_off").is_not_null()
    return df.with_columns(pl.when(fill).then(pl.col("local_rank") + pl.col("_off")).otherwise(pl.col("rank"))
                           .cast(pl.Int32).alias("rank")).drop("_off")


def _kernel_hosts(df: pl.DataFrame) -> pl.DataFrame:
    """A kernel log's host as its file names it (`dmesg-<host>.txt`, FORMATS.md §2.2) may carry more than
    the host: `dmesg-T-gpu-h12.txt` (the `dmesg -T` flag in the name). A kernel host that no worker line
    names, ending in exactly one host the workers name (after `-`, `_` or `.`), is that host."""
    kernel = pl.col("source") == "kernel"
    theirs = set(df.filter(~kernel)["host"].drop_nulls().unique().to_list())
    if not theirs:
        return df
    fix = {}
    for h in df.filter(kernel)["host"].drop_nulls().unique().to_list():
        if h in theirs:
            continue
        ends = [t for t in theirs if len(h) > len(t) and h.endswith(t) and h[-len(t) - 1] in "-_."]
        if len(ends) == 1:
            fix[h] = ends[0]
    if not fix:
        return df
    return df.with_columns(pl.when(kernel).then(pl.col("host").replace(fix)).otherwise(pl.col("host")).alias("host"))


def fill_ranks(df: pl.DataFrame) -> pl.DataFrame:
    """Global ranks from local ranks and pids (FORMATS.md §2.1): the map comes from rows having both."""
    if df.is_empty():
        return df
    df = _kernel_hosts(df)
    df = _line_ranks(df)
    df = _srun_ranks(df)
    df = _tabled_ranks(df)
    # Where a row ran: its node (torchrun log-dir tree, host folder), else its host, else the one host
    # its file names, else the file. Local ranks and pids mean something only within one such place.
    file_host = (df.filter(pl.col("host").is_not_null()).group_by("file")
                 .agg(pl.col("host").n_unique().alias("_nh"), pl.col("host").first().alias("_fh"))
                 .filter(pl.col("_nh") == 1).select("file", "_fh"))
    # An `srun --label` task id with torchrun inside is the node index (FORMATS.md §1.7): it names the
    # place of every line of that node's agent and workers, also those without a host.
    task = extra_field("srun_task")
    df = df.join(file_host, on="file", how="left").with_columns(
        pl.when(task.is_not_null()).then(pl.concat_str([pl.col("file"), pl.lit("@task"), task]))
        .when(pl.col("node") != "").then(pl.col("node"))
        .otherwise(pl.coalesce("host", "_fh", "file")).alias("_at")
    ).drop("_fh")
    # (place, local_rank) -> rank, from rows that carry both (tee + rank prefix, ChildFailedError,
    # NCCL init); a pair that maps to more than one rank says nothing.
    df = _map_rank(df, ["_at", "local_rank"])
    df = _node_offsets(df)
    # a single-node run: local rank == global rank
    nodes = df.filter(pl.col("local_rank").is_not_null())["node"].unique().to_list()
    hosts = df["host"].drop_nulls().unique().to_list()
    if len(nodes) <= 1 and len(hosts) <= 1:
        df = df.with_columns(pl.coalesce("rank", "local_rank").alias("rank"))
    # worker pid -> rank (ChildFailedError, error.json, worker_failed lines carry pids)
    df = _map_rank(df, ["_at", "pid"])
    # NCCL's world-communicator ranks (checked against the ranks known so far), then pids again
    df = _map_rank(_nccl_world_ranks(df), ["_at", "pid"]).drop("_at")
    df = _single_writer_files(df)
    # and rank -> host, where some line of that rank named its host
    host_map = (df.filter(pl.col("rank").is_not_null() & pl.col("host").is_not_null())
                .group_by("rank").agg(pl.col("host").mode().first().alias("_h")))
    df = df.join(host_map, on="rank", how="left")
    return df.with_columns(pl.coalesce("host", "_h").alias("host")).drop("_h")

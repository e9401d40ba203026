"""What a finished sweep holds, read from the files it wrote (so it is the same whichever launcher
ran the points): rows per status, the points that failed, and the points without a result
(running in another process, or interrupted). Its ``exit_code`` is the sweep's: 0 when every
point has rows and none is ``error`` or ``incorrect``, else 1."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Tuple

from harness import results
from harness.point_lock import LOCK_FILE, is_locked

#: row statuses that make a sweep's exit code 1
FAILING = ("error", "incorrect")


@dataclass
class SweepOutcome:
    sweep_dir: Path
    points: int = 0
    rows_by_status: Dict[str, int] = field(default_factory=dict)
    failed: List[Tuple[str, str, str, str]] = field(default_factory=list)  # (job, backend, status, error)
    running: List[str] = field(default_factory=list)   # jobs whose lock another process holds
    missing: List[str] = field(default_factory=list)   # jobs without a readable result, not locked

    @property
    def exit_code(self) -> int:
        return 1 if self.failed or self.missing else 0

    def lines(self) -> List[str]:
        """The summary, one fact per line."""
        counts = ", ".join(f"{s} {n}" for s, n in sorted(self.rows_by_status.items(),
                                                         key=lambda kv: results.STATUSES.index(kv[0])
                                                         if kv[0] in results.STATUSES else 99))
        rows = sum(self.rows_by_status.values())
        out = [f"sweep {self.sweep_dir}: {self.points} points, {rows} rows" + (f": {counts}" if counts else "")]
        out += [f"  {status:<9} {job} [{backend}]: {err}" for job, backend, status, err in self.failed]
        out += [f"  running   {job} (another process holds its lock; its rows come when it ends)"
                for job in self.running]
        out += [f"  no result {job} (interrupted or unreadable: the same command redoes it)"
                for job in self.missing]
        return out


def job_dirs(sweep_dir: Path) -> List[Path]:
    """Every point directory of a sweep: those Hydra made (``.hydra``), a lock or a result marks."""
    marks = [p.parent for name in (".hydra", LOCK_FILE, results.RESULT_FILE) for p in sweep_dir.rglob(name)]
    return sorted({d for d in marks if d != sweep_dir and "report" not in d.relative_to(sweep_dir).parts})


def sweep_outcome(sweep_dir: str | Path) -> SweepOutcome:
    """Reads ``sweep_dir``'s result files (an unreadable one counts as a point without result)."""
    sweep_dir = Path(sweep_dir)
    out = SweepOutcome(sweep_dir)
    for job in job_dirs(sweep_dir):
        out.points += 1
        name = str(job.relative_to(sweep_dir))
        df = results.read_result(job / results.RESULT_FILE)
        if df is None:
            (out.running if is_locked(job) else out.missing).append(name)
            continue
        for status, n in df["status"].value_counts().items():
            out.rows_by_status[str(status)] = out.rows_by_status.get(str(status), 0) + int(n)
        bad = df[df["status"].isin(FAILING)]
        out.failed += [(name, str(r["backend"]), str(r["status"]),
                        r["error"].splitlines()[0] if isinstance(r["error"], str) and r["error"] else "")
                       for _, r in bad.iterrows()]
    return out

"""What a PostgreSQL failover loses: writers submit tasks as fast as one
replica takes them; once a few hundred are acknowledged, the primary is
stopped at once (immediate shutdown, its data discarded), the standby (in
another zone: its link delays what the primary sends by 100 ms) promoted
and the servers' address moved to it; then every task a client was
told of is looked for on the new primary.

With a synchronous standby (what ``deploy/README.md`` tells operators to
configure) none may be missing: that is the test. Run as a script, it
measures both ways, so the README can say what asynchronous replication
loses::

    .venv/bin/python tests/chaos/test_failover.py --trials 5
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import threading
import time
import uuid

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "deploy")]

import grpc  # noqa: E402

from harness import Cluster, PgProxy, Submitted, submit_request  # noqa: E402
from invariants import psql_rows  # noqa: E402
from pgcluster import PrivatePostgres  # noqa: E402

WRITERS = 8
BEFORE = 300  # acknowledged tasks before the primary goes
#: The standby's link delays what the primary sends by this much.
LINK_DELAY_MS = 100


def failover_under_writes(synchronous: bool, workdir: pathlib.Path) -> tuple[int, int, float]:
    """(tasks acknowledged, of those missing on the new primary, submits a
    second before the failover)."""
    pg = PrivatePostgres(standby=True, synchronous=synchronous, link_delay_ms=LINK_DELAY_MS)
    proxy = PgProxy("127.0.0.1", pg.primary.port)
    cluster = Cluster(proxy.url(pg.url()), workdir, count=1)
    acknowledged: list[str] = []
    lock = threading.Lock()
    enough = threading.Event()
    stop = threading.Event()

    def write(n: int) -> None:
        replica = cluster.live()[0]
        i = 0
        while not stop.is_set():
            task = Submitted(f"failover-{n}-{i}-{uuid.uuid4().hex[:6]}", "", [], False)
            i += 1
            try:
                reply = replica.tasks.SubmitTask(submit_request(task, i, max_attempts=1), timeout=5)
            except grpc.RpcError:
                time.sleep(0.02)  # not acknowledged: not counted
                continue
            with lock:
                acknowledged.append(reply.task.task_id)
                if len(acknowledged) >= BEFORE:
                    enough.set()

    writers = [threading.Thread(target=write, args=(n,), daemon=True) for n in range(WRITERS)]
    try:
        started = time.monotonic()
        for w in writers:
            w.start()
        assert enough.wait(120), f"only {len(acknowledged)} tasks acknowledged in 120 s"
        rate = BEFORE / (time.monotonic() - started)
        proxy.cut()
        pg.kill_primary_and_promote()
        proxy.retarget("127.0.0.1", pg.primary.port)
        stop.set()
        for w in writers:
            w.join()
        with lock:
            told = list(acknowledged)
        stored = {r["id"] for r in psql_rows(pg.url(), "SELECT id FROM tasks")}
        return len(told), len([t for t in told if t not in stored]), rate
    finally:
        stop.set()
        cluster.stop()
        proxy.close()
        pg.close()


def test_a_failover_to_a_synchronous_standby_loses_no_acknowledged_task(tmp_path: pathlib.Path):
    told, lost, _ = failover_under_writes(synchronous=True, workdir=tmp_path)
    assert told >= BEFORE
    assert lost == 0, f"{lost} of {told} acknowledged tasks are not on the promoted standby"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    for synchronous in (True, False):
        results = []
        for _ in range(args.trials):
            with tempfile.TemporaryDirectory() as workdir:
                results.append(failover_under_writes(synchronous, pathlib.Path(workdir)))
        mode = "synchronous" if synchronous else "asynchronous"
        lost = [lost for _, lost, _ in results]
        rates = sorted(rate for _, _, rate in results)
        print(f"{mode}: lost {lost} of {[told for told, _, _ in results]} acknowledged "
              f"(total {sum(lost)} of {sum(told for told, _, _ in results)}); "
              f"submits/s before the failover: median {rates[len(rates) // 2]:.0f} "
              f"({rates[0]:.0f}-{rates[-1]:.0f})", flush=True)


if __name__ == "__main__":
    main()

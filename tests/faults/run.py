"""Runs seeded fault schedules against a real cluster and checks them.

  python3 tests/faults/run.py --seed 7                  one schedule
  python3 tests/faults/run.py --seeds 1-100 --parallel 2 --out /tmp/faults
                                                         a long run
  python3 tests/faults/run.py --seed 7 --kinds isolate-owner,kill9

Each schedule prints its seed and plan, one line per nemesis event
(`t=1843ms broker-1 PARTITION bookies`), and the checker's summary. Runs whose
checker finds anomalies keep their directory (history.jsonl, events.jsonl,
process logs) under --out; clean runs keep only result.json and run.log
(report.py sums them up). Exit status 1 if any schedule failed.
"""

import argparse
import fcntl
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import checker  # noqa: E402
from cluster import FaultCluster  # noqa: E402
from nemesis import Nemesis, describe, make_plan  # noqa: E402

# After the last heal, sends go on this long in a healthy cluster before
# the workload stops producing: every fault gets its recovery measured.
HEALTHY_TAIL_S = 12.0
DRAIN_S = 30.0


def setup_namespaces(cluster):
    """public/e3: E=3 Qw=3 Qa=2; public/e2: E=Qw=Qa=2; dedup on in both."""
    for ns, (e, qw, qa) in (("e3", (3, 3, 2)), ("e2", (2, 2, 2))):
        status, body = cluster.http("PUT", "/admin/v2/namespaces/public/%s" % ns)
        assert status in (204, 409), (status, body)
        persistence = {"bookkeeperEnsemble": e, "bookkeeperWriteQuorum": qw, "bookkeeperAckQuorum": qa, "managedLedgerMaxMarkDeleteRate": 0.0}
        status, body = cluster.http("POST", "/admin/v2/namespaces/public/%s/persistence" % ns, json.dumps(persistence))
        assert status == 204, (status, body)
        status, body = cluster.http("POST", "/admin/v2/namespaces/public/%s/deduplication" % ns, "true")
        assert status == 204, (status, body)


def run_schedule(seed, slot=0, window_s=30.0, out=None, kinds=None, verbose=True, prefix=False, keep=False):
    """One schedule; returns its result dict (result['valid'])."""
    rng = random.Random(seed)
    topics = ["persistent://public/e3/faults-%d-a" % seed, "persistent://public/e2/faults-%d-b" % seed]
    plan = make_plan(rng, window_s, len(topics), kinds=kinds)
    run_dir = os.path.join(out or "/tmp/vela-faults", "seed-%d" % seed)
    # A kept run of the same seed must not lend its etcd data to this one.
    shutil.rmtree(os.path.join(run_dir, "cluster"), ignore_errors=True)
    os.makedirs(run_dir, exist_ok=True)
    lines = []
    lock = threading.Lock()

    def log(line):
        with lock:
            lines.append(line)
            if verbose:
                print("[seed %d] %s" % (seed, line) if prefix else line, flush=True)

    events_path = os.path.join(run_dir, "events.jsonl")
    history_path = os.path.join(run_dir, "history.jsonl")
    for path in (events_path, history_path):
        if os.path.exists(path):
            os.remove(path)
    events_file = open(events_path, "a")

    def record(e):
        with lock:
            events_file.write(json.dumps(e) + "\n")
            events_file.flush()

    log("seed=%d  (reproduce: python3 tests/faults/run.py --seed %d%s)" % (seed, seed, " --kinds " + ",".join(kinds) if kinds else ""))
    for f in plan:
        log("plan: at %5.1fs for %4.1fs  #%d %s" % (f["at"], f["hold"], f["id"], describe(f)))
    t_begin = time.time()
    cluster = None
    workload = None
    result = {"seed": seed, "plan": plan, "valid": False}
    try:
        cluster = FaultCluster(slot, seed, workdir=os.path.join(run_dir, "cluster"), live_groups=LIVE_GROUPS)
        log("cluster up in %.1fs (clock faults %s)" % (time.time() - t_begin, "on" if cluster.faketime else "off: no libfaketime"))
        setup_namespaces(cluster)
        t0 = time.time()
        cfg = {
            "service_url": cluster.service_url(),
            "broker_urls": cluster.broker_urls(),
            "topics": topics,
            "history": history_path,
            "t0": t0,
            "produce_s": window_s + HEALTHY_TAIL_S,
            "rate_per_producer": 40,
            "producers_per_topic": 2,
            "consumers_per_topic": 2,
            "send_timeout_ms": 10000,
            "drain_s": DRAIN_S,
            "operation_timeout_s": 10,
        }
        cfg_path = os.path.join(run_dir, "workload.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        workload = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "workload.py"), cfg_path],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        cluster.workload_pid = workload.pid
        LIVE_GROUPS[("workload", seed)] = workload.pid
        workload_lines = []
        producing = threading.Event()

        def pump():
            for line in workload.stdout:
                workload_lines.append(line.rstrip("\n"))
                if "workload: producing" in line:
                    producing.set()

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.time() + 60
        while not producing.is_set():
            if workload.poll() is not None or time.time() > deadline:
                raise RuntimeError("workload did not start:\n" + "\n".join(workload_lines[-40:]))
            time.sleep(0.05)
        t_start = time.time()
        nemesis = Nemesis(cluster, topics, t0, log, record)
        log("t=%dms - START producing (%d producers, %d msg/s each)" % (nemesis.now_ms(), len(topics) * 2, cfg["rate_per_producer"]))
        nemesis.run(plan, t_start)
        wait = t_start + window_s - time.time()
        if wait > 0:
            time.sleep(wait)
        nemesis.heal_all()
        log("t=%dms - HEAL ALL" % nemesis.now_ms())
        try:
            workload.wait(timeout=HEALTHY_TAIL_S + DRAIN_S + 180)
        except subprocess.TimeoutExpired:
            log("workload hung: killed")
            os.killpg(workload.pid, signal.SIGKILL)
            workload.wait(timeout=10)
        log("t=%dms - workload exited %s" % (nemesis.now_ms(), workload.returncode))
        if cluster.net.unknown_peers:
            log("proxy: %d connections from processes it could not name (no link rule applied to them): %s" % (cluster.net.unknown_peers, cluster.net.unknown_samples[-5:]))
        events_file.close()
        found, stats, availability = checker.check(checker.load(history_path), checker.load(events_path))
        if workload.returncode != 0:
            found.setdefault("workload-error", []).append("exit %s: %s" % (workload.returncode, " | ".join(workload_lines[-5:])))
        text = checker.summary(found, stats, availability)
        for line in text.splitlines():
            log(line)
        result.update(valid=not any(found.values()), anomalies={k: v[:20] for k, v in found.items() if v}, stats=stats, availability=availability)
        if not result["valid"]:
            with open(os.path.join(run_dir, "workload.log"), "w") as f:
                f.write("\n".join(workload_lines))
    except Exception:
        log("harness error:\n" + traceback.format_exc())
        result["error"] = traceback.format_exc()
    finally:
        if workload is not None and workload.poll() is None:
            try:
                os.killpg(workload.pid, signal.SIGKILL)
            except OSError:
                pass
        if not events_file.closed:
            events_file.close()
        if cluster is not None:
            keep = keep or not result["valid"]
            if keep:
                with open(os.path.join(run_dir, "processes.log"), "w") as f:
                    f.write(cluster.logs(lines=3000))
            cluster.close(keep_dir=keep)
        LIVE_GROUPS.pop(("workload", seed), None)
        result["seconds"] = round(time.time() - t_begin, 1)
        with open(os.path.join(run_dir, "result.json"), "w") as f:
            json.dump(result, f, indent=1)
        with open(os.path.join(run_dir, "run.log"), "w") as f:
            f.write("\n".join(lines) + "\n")
        if result["valid"] and not keep:
            for name in ("history.jsonl", "events.jsonl", "workload.json"):
                try:
                    os.remove(os.path.join(run_dir, name))
                except OSError:
                    pass
    log("seed=%d %s in %.0fs" % (seed, "VALID" if result["valid"] else "FAILED", result["seconds"]))
    return result


SLOTS_MAX = 50  # 127.100.x.x .. 127.149.x.x
# Process groups of every cluster process and workload running now: killed
# if this harness is told to stop (SIGTERM, SIGINT, SIGHUP).
LIVE_GROUPS = {}


def _kill_live_groups(signum, _frame):
    for pgid in list(LIVE_GROUPS.values()):
        try:
            os.killpg(pgid, signal.SIGCONT)
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
    print("stopped by signal %d: every process killed" % signum, flush=True)
    os._exit(1)


def take_slot():
    """A slot (address block) no other run on this machine holds: an
    exclusive lock on /tmp/vela-faults-slot-N.lock, kept until the process
    closes the returned file."""
    for slot in range(SLOTS_MAX):
        f = open("/tmp/vela-faults-slot-%d.lock" % slot, "w")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return slot, f
        except OSError:
            f.close()
    raise RuntimeError("all %d address slots are taken" % SLOTS_MAX)


def parse_seeds(text):
    seeds = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            seeds.extend(range(int(a), int(b) + 1))
        else:
            seeds.append(int(part))
    return seeds


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--seeds", help="e.g. 1-100 or 3,7,9")
    ap.add_argument("--window-s", type=float, default=30.0, help="faults happen in the first WINDOW_S seconds of producing")
    ap.add_argument("--parallel", type=int, default=1, help="schedules at once (each its own cluster and addresses)")
    ap.add_argument("--out", default="/tmp/vela-faults")
    ap.add_argument("--kinds", help="comma-separated fault kinds to draw from (default: all)")
    ap.add_argument("--keep", action="store_true", help="keep histories and logs of valid runs too")
    ap.add_argument("--plan", action="store_true", help="print the plans of the seeds and exit")
    args = ap.parse_args()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _kill_live_groups)
    seeds = [args.seed] if args.seed is not None else parse_seeds(args.seeds or str(random.randrange(1 << 20)))
    kinds = args.kinds.split(",") if args.kinds else None
    if args.plan:
        for seed in seeds:
            print("seed %d:" % seed)
            for f in make_plan(random.Random(seed), args.window_s, 2, kinds=kinds):
                print("  at %5.1fs for %4.1fs  #%d %s" % (f["at"], f["hold"], f["id"], describe(f)))
        return
    results = []
    lock = threading.Lock()
    queue = list(seeds)

    def worker(_):
        slot, lock_file = take_slot()
        while True:
            with lock:
                if not queue:
                    return
                seed = queue.pop(0)
            r = run_schedule(seed, slot=slot, window_s=args.window_s, out=args.out, kinds=kinds, prefix=args.parallel > 1, keep=args.keep)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=worker, args=(slot,)) for slot in range(min(args.parallel, len(seeds)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bad = [r["seed"] for r in results if not r["valid"]]
    print("\n%d schedules, %d valid, failed seeds: %s" % (len(results), len(results) - len(bad), bad or "none"))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

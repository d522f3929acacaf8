"""Faults and seeded schedules.

A schedule is planned up front from one `random.Random(seed)`: every choice
(which fault, when, for how long, which target, which parameters) is drawn
from it before the cluster starts, and printed, so a seed names one plan.
Targets that depend on the run ("the broker owning topic 0") are resolved
when the fault starts (the resolution is logged).

The fault model (what we claim to survive; everything here is injected):
- network: any directed link between two processes may hold its bytes
  (partition, asymmetric when one direction only), delay them, stall them as
  lost segments do, or have its connections reset;
- processes: kill -9 (then restarted on the same data) and SIGSTOP (then
  SIGCONT) of any broker, bookie or etcd;
- clocks: a broker's or bookie's wall clock steps (libfaketime; the
  monotonic clock never jumps);
- never: disk corruption, lost fsynced data, more than one bookie of an
  ensemble losing its disk (not in this suite).
"""

import threading
import time

from netproxy import Rule

KINDS = [
    # (kind, weight)
    ("partition-broker-bookies", 3),
    ("partition-broker-etcd", 3),
    ("isolate-owner", 4),
    ("isolate-bookie", 4),
    ("asymmetric", 3),
    ("loss", 2),
    ("delay", 2),
    ("kill9", 3),
    ("pause", 3),
    ("clock", 2),
    ("reset", 2),
]
ASYMMETRIC_VARIANTS = [
    "broker->bookies",
    "bookies->broker",
    "broker->etcd",
    "etcd->broker",
    "bookie-deaf",
    "bookie-mute",
    "client->owner",
]


def _weighted(rng, pairs):
    total = sum(w for _, w in pairs)
    x = rng.uniform(0, total)
    for item, w in pairs:
        x -= w
        if x <= 0:
            return item
    return pairs[-1][0]


def _broker_spec(rng, topic_count, brokers):
    if rng.random() < 0.7:
        return "owner:%d" % rng.randrange(topic_count)
    return "broker-%d" % rng.randrange(brokers)


def plan_fault(rng, kind, topic_count, brokers, bookies):
    """One fault's parameters (a dict), drawn from `rng`."""
    f = {"kind": kind}
    if kind in ("partition-broker-bookies", "partition-broker-etcd"):
        f["target"] = _broker_spec(rng, topic_count, brokers)
    elif kind == "isolate-owner":
        f["target"] = "owner:%d" % rng.randrange(topic_count)
        f["clients_too"] = rng.random() < 0.4
    elif kind == "isolate-bookie":
        f["target"] = "bookie-%d" % rng.randrange(bookies)
    elif kind == "asymmetric":
        f["variant"] = rng.choice(ASYMMETRIC_VARIANTS)
        if f["variant"] in ("bookie-deaf", "bookie-mute"):
            f["target"] = "bookie-%d" % rng.randrange(bookies)
        else:
            f["target"] = _broker_spec(rng, topic_count, brokers)
    elif kind in ("loss", "delay"):
        f["target"] = rng.choice(
            ["owner:%d" % rng.randrange(topic_count), "bookie-%d" % rng.randrange(bookies), "etcd"]
        )
        if kind == "loss":
            f["loss"] = round(rng.uniform(0.02, 0.15), 2)
        else:
            f["delay_ms"] = rng.randrange(20, 400)
            f["jitter_ms"] = rng.randrange(0, 100)
    elif kind in ("kill9", "pause"):
        x = rng.random()
        if x < 0.45:
            f["target"] = _broker_spec(rng, topic_count, brokers)
        elif x < 0.9:
            f["target"] = "bookie-%d" % rng.randrange(bookies)
        else:
            f["target"] = "etcd"
    elif kind == "clock":
        f["target"] = rng.choice(["owner:%d" % rng.randrange(topic_count), "bookie-%d" % rng.randrange(bookies)])
        f["offset_s"] = rng.choice([-1, 1]) * rng.choice([30, 300, 3600, 86400])
    elif kind == "reset":
        f["target"] = rng.choice(
            ["owner:%d" % rng.randrange(topic_count), "bookie-%d" % rng.randrange(bookies), "etcd"]
        )
    else:
        raise ValueError(kind)
    return f


def make_plan(rng, window_s, topic_count, brokers=3, bookies=3, start_s=3.0, kinds=None):
    """[{id, at, hold, kind, ...}] with faults starting in [start_s, window_s)
    and every one healed by `window_s`. `kinds` restricts the choice."""
    pairs = [(k, w) for k, w in KINDS if kinds is None or k in kinds]
    plan = []
    t = start_s
    while True:
        hold = round(rng.uniform(2.0, 8.0), 1)
        if t + hold > window_s:
            break
        f = plan_fault(rng, _weighted(rng, pairs), topic_count, brokers, bookies)
        f.update(id=len(plan), at=round(t, 1), hold=hold)
        plan.append(f)
        # Sometimes a second fault lands on top of the first (mixed faults).
        if rng.random() < 0.2:
            g = plan_fault(rng, _weighted(rng, pairs), topic_count, brokers, bookies)
            at2 = round(t + rng.uniform(0, hold / 2), 1)
            g.update(id=len(plan), at=at2, hold=round(min(rng.uniform(1.0, 5.0), window_s - at2), 1))
            plan.append(g)
        t += hold + rng.uniform(2.0, 5.0)
    return plan


def describe(f):
    parts = [f["kind"], f.get("target", "")]
    for k in ("variant", "clients_too", "loss", "delay_ms", "jitter_ms", "offset_s"):
        if k in f:
            parts.append("%s=%s" % (k, f[k]))
    return " ".join(str(p) for p in parts if p != "")


class Nemesis:
    """Applies a plan to a FaultCluster. Link rules of overlapping faults
    combine (a held link stays held until no fault holds it)."""

    def __init__(self, cluster, topics, t0, log, record):
        self.c = cluster
        self.topics = topics
        self.t0 = t0
        self.log = log  # log(line) prints one event line
        self.record = record  # record(dict) appends to events.jsonl
        self.active = {}  # fault id -> {"links": {(frm, to): Rule}, "undo": callable}
        self.applied = {}
        self.restarts = {}  # name -> thread restarting it

    def _restart_async(self, name, fault_id=None):
        """Restarts `name` without holding up the schedule (a bookie waits
        for its old registration to expire, a broker for its port)."""
        if name in self.restarts and self.restarts[name].is_alive():
            return

        def go():
            began = time.time()
            try:
                self.c.restart(name)
                extra = {} if fault_id is None else {"fault": fault_id, "phase": "ready"}
                self.event(name, "RESTARTED (ready after %.1fs)" % (time.time() - began), **extra)
            except Exception as e:  # noqa: BLE001 - logged; heal_all tries again
                self.event(name, "RESTART FAILED: %r" % e)

        t = threading.Thread(target=go, daemon=True)
        self.restarts[name] = t
        t.start()

    def wait_restarts(self):
        for t in list(self.restarts.values()):
            t.join(timeout=180)

    def now_ms(self):
        return int((time.time() - self.t0) * 1000)

    def event(self, node, what, **extra):
        self.log("t=%dms %s %s" % (self.now_ms(), node, what))
        extra.update(t=self.now_ms(), node=node, what=what)
        self.record(extra)

    def nodes(self):
        return ["etcd"] + self.c.bookies + self.c.brokers + ["client"]

    def resolve(self, spec):
        if spec.startswith("owner:"):
            topic = self.topics[int(spec.split(":")[1])]
            owner = self.c.owner_of(topic)
            if owner is None:
                # No broker answered a lookup (all partitioned, say): the
                # first broker stands in, deterministically.
                owner = self.c.brokers[0]
            return owner
        return spec

    # --- links ---------------------------------------------------------------------

    def _sync_links(self):
        want = {}
        for fault in self.active.values():
            for link, rule in fault["links"].items():
                have = want.get(link)
                if have is None or rule.kind == "blackhole":
                    want[link] = rule
        for link in set(self.applied) | set(want):
            if self.applied.get(link) is not want.get(link):
                self.c.net.set_rule(link[0], link[1], want.get(link))
        self.applied = want

    @staticmethod
    def _both(a, bs, rule):
        links = {}
        for b in bs:
            if b != a:
                links[(a, b)] = rule
                links[(b, a)] = rule
        return links

    # --- start / heal ----------------------------------------------------------------

    def start(self, f):
        kind = f["kind"]
        target = self.resolve(f["target"]) if "target" in f else None
        links, undo, what = {}, None, describe(f)
        hole = Rule("blackhole")
        c = self.c
        if kind == "partition-broker-bookies":
            links = self._both(target, c.bookies, hole)
            what = "PARTITION bookies"
        elif kind == "partition-broker-etcd":
            links = self._both(target, ["etcd"], hole)
            what = "PARTITION etcd"
        elif kind == "isolate-owner":
            others = ["etcd"] + c.bookies + [b for b in c.brokers if b != target]
            if f["clients_too"]:
                others.append("client")
            links = self._both(target, others, hole)
            what = "ISOLATE from %s" % ("everyone" if f["clients_too"] else "etcd, bookies, brokers (clients still reach it)")
        elif kind == "isolate-bookie":
            links = self._both(target, [n for n in self.nodes() if n != "client"], hole)
            what = "ISOLATE from everyone"
        elif kind == "asymmetric":
            v = f["variant"]
            if v == "broker->bookies":
                links = {(target, b): hole for b in c.bookies}
            elif v == "bookies->broker":
                links = {(b, target): hole for b in c.bookies}
            elif v == "broker->etcd":
                links = {(target, "etcd"): hole}
            elif v == "etcd->broker":
                links = {("etcd", target): hole}
            elif v == "bookie-deaf":
                links = {(n, target): hole for n in self.nodes() if n != target}
            elif v == "bookie-mute":
                links = {(target, n): hole for n in self.nodes() if n != target}
            elif v == "client->owner":
                links = {("client", target): hole}
            what = "ASYMMETRIC %s" % v
        elif kind == "loss":
            links = self._both(target, self.nodes(), Rule("loss", loss=f["loss"]))
            what = "LOSS %d%% on all its links" % (f["loss"] * 100)
        elif kind == "delay":
            rule = Rule("delay", delay_s=f["delay_ms"] / 1000.0, jitter_s=f["jitter_ms"] / 1000.0)
            links = self._both(target, self.nodes(), rule)
            what = "DELAY %dms+-%dms on all its links" % (f["delay_ms"], f["jitter_ms"])
        elif kind == "kill9":
            c.kill9(target)
            what = "KILL -9"

            def undo(target=target, fault_id=f["id"]):
                if c.procs[target].alive():
                    return None
                self._restart_async(target, fault_id)
                return "RESTARTING"

        elif kind == "pause":
            if c.procs[target].alive():
                c.stop_signal(target)
                what = "SIGSTOP"
            else:
                what = "SIGSTOP skipped (not running)"

            def undo(target=target):
                c.cont_signal(target)
                return "SIGCONT"

        elif kind == "clock":
            if target in c.clock_files:
                c.set_clock(target, f["offset_s"])
                what = "CLOCK %+ds (wall clock step)" % f["offset_s"]

                def undo(target=target):
                    c.set_clock(target, 0)
                    return "CLOCK back to +0s"

            else:
                what = "CLOCK skipped (no libfaketime)"
        elif kind == "reset":
            count = sum(c.net.reset(target, n) for n in self.nodes() if n != target)
            what = "RESET %d connections" % count
        self.active[f["id"]] = {"links": links, "undo": undo, "target": target}
        self._sync_links()
        self.event(target or "-", what, fault=f["id"], kind=kind, phase="start", target=target)

    def heal(self, f):
        fault = self.active.pop(f["id"], None)
        if fault is None:
            return
        self._sync_links()
        what = None
        if fault["undo"] is not None:
            what = fault["undo"]()
        self.event(fault["target"] or "-", "HEAL %s%s" % (f["kind"], (" " + what) if what else ""),
                   fault=f["id"], kind=f["kind"], phase="heal", target=fault["target"])  # fmt: skip

    def heal_all(self):
        """Ends every fault: links pass, processes run, clocks right."""
        for fid in sorted(self.active):
            fault = self.active.pop(fid)
            if fault["undo"] is not None:
                fault["undo"]()
        self.c.net.heal()
        self.applied = {}
        self.wait_restarts()
        for name, p in self.c.procs.items():
            if p.alive():
                self.c.cont_signal(name)
            else:
                self.c.restart(name)
                self.event(name, "RESTARTED (was down at the final heal)")
        for name in self.c.clock_files:
            self.c.set_clock(name, 0)

    def run(self, plan, t_start):
        """Executes `plan` with times relative to `t_start` (epoch s)."""
        actions = []
        for f in plan:
            actions.append((f["at"], 0, f))
            actions.append((f["at"] + f["hold"], 1, f))
        actions.sort(key=lambda a: (a[0], a[1], a[2]["id"]))
        for at, is_heal, f in actions:
            wait = t_start + at - time.time()
            if wait > 0:
                time.sleep(wait)
            try:
                if is_heal:
                    self.heal(f)
                else:
                    self.start(f)
            except Exception as e:  # noqa: BLE001 - a nemesis error is logged, the run goes on
                self.event("-", "NEMESIS ERROR on fault %d (%s): %r" % (f["id"], f["kind"], e))

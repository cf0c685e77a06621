"""The binder's gangs: the waiting pods of each gang map that holds no slot, decided together.

A pod of a gang map is not decided alone while its gang holds no slot: every waiting pod of the
gang is planned (`plan`, as for any pod, its claim checked in dra enforcement), and
`placement.gang.decide` says whether all go now or all wait. All go: each is assumed and its
Binding sent, one after the other from this one decision, so the Bindings leave together. All
wait: no slot is assumed, so no GPU of the gang is held; the pod decided reports the gang's
status (`GangWaiting: 3 of 4 ranks ready; slot 3 waits NodeCordoned: ...`) and waits for what
any member waits for. A gang waiting past its `timeoutSeconds` is stuck: every member reports
GangStuck (condition and Event) and `gpuplace_gangs_stuck` counts it; it still binds whole or not
at all. Once the gang holds a slot, its pods are decided alone (a restarted rank).

The gang's standing (`state`: N of M ranks ready, the slots that wait and why, stuck) is kept
for its map's status: `on_change` says a map's standing changed (the status writer reads
`state` on its own thread), and `on_stuck` puts an Event on the map when its gang turns stuck.

Contract: `note` and `forget` are called from informer threads and the binder thread, under
`_lock`; `decide` and the clocks run on the binder thread only; `state` is read from any thread,
under `_lock`. Each member is planned, reported and sent by the binder's own steps for one pod
(controller/onepod.py), so a gang's pod waits and binds exactly as a pod decided alone does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from controller.bindsend import Waiting
from controller.onepod import OnePod
from kubeio.pod import Pod
from placement.binding import Cluster, PodFacts, SlotView
from placement.draalloc import ClaimPlan
from placement.gang import GangVerdict, Member, decide, gang_is_bound, unranked
from placement.indexing import resolve_index
from placement.model import CompiledMap
from placement.podmeta import identity_of, map_name_of
from placement.status import GangStatus
from placement.types import MapKey


@dataclass
class Gangs:
    steps: OnePod  # the binder's steps for one pod: each member is planned, parked, sent alike
    waiting: Waiting  # the binder's waiting pods (read under its lock)
    report_stuck: Callable[[int], None] = lambda _count: None  # gpuplace_gangs_stuck
    clock: Callable[[], float] = time.monotonic
    on_change: Callable[[MapKey], None] = lambda _key: None  # a gang's standing changed
    on_stuck: Callable[[MapKey, str], None] = lambda _key, _message: None  # the map's Event
    _states: dict[MapKey, GangStatus] = field(default_factory=dict)
    _members: dict[MapKey, dict[str, None]] = field(default_factory=dict)
    _map_of: dict[str, MapKey] = field(default_factory=dict)
    _since: dict[MapKey, float] = field(default_factory=dict)
    _stuck: set[MapKey] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, uid: str, pod: Pod) -> None:
        """A waiting pod of a map (any map: whether it is a gang is read when deciding)."""
        name = map_name_of(pod)
        if name is None:
            return
        key = MapKey(pod.namespace, name)
        with self._lock:
            self._members.setdefault(key, {})[uid] = None
            self._map_of[uid] = key

    def forget(self, uid: str) -> None:
        with self._lock:
            key = self._map_of.pop(uid, None)
            if key is not None:
                line = self._members.get(key)
                if line is not None:
                    line.pop(uid, None)
                    if not line:
                        del self._members[key]
            # Its last waiting pod gone (bound, or deleted): the gang no longer waits.
            gone = key is not None and key not in self._members and key in self._states
            if key is not None and gone:
                del self._states[key]
        if key is not None and gone:
            self.on_change(key)

    def state(self, key: MapKey) -> GangStatus | None:
        """The gang of map `key` while it waits, as last decided; None when it does not."""
        with self._lock:
            return self._states.get(key)

    def _set_state(self, key: MapKey, state: GangStatus | None) -> None:
        with self._lock:
            before = self._states.get(key)
            if state is None:
                self._states.pop(key, None)
            else:
                self._states[key] = state
        if before != state:
            self.on_change(key)

    def decide(self, uid: str, pod: Pod, facts: PodFacts, cluster: Cluster) -> bool:
        """Decides the pod with its gang when it is a member of a gang that holds no slot; False
        when it is not (the binder decides it alone)."""
        cmap = self.gang_of(facts, cluster, self.steps.cache)
        if cmap is None:
            return False
        self._decide(uid, pod, cmap, cluster)
        return True

    def gang_of(self, facts: PodFacts, cluster: Cluster, slots: SlotView) -> CompiledMap | None:
        """The pod's gang map, when the gang holds no slot (a bound gang's pods go alone)."""
        if facts.map_name is None:
            return None
        cmap = cluster.model.maps.get(MapKey(facts.namespace, facts.map_name))
        if cmap is None or cmap.gang is None or gang_is_bound(cmap, slots):
            return None
        return cmap

    def _decide(self, uid: str, pod: Pod, cmap: CompiledMap, cluster: Cluster) -> None:
        """Decides the whole gang of `pod` (see the module's docstring)."""
        members: list[Member] = []
        pods: dict[str, Pod] = {}
        claims: dict[str, ClaimPlan | None] = {}
        for other_uid, other in self._waiting(cmap.key, uid, pod):
            facts = self.steps.facts(other)
            choice = resolve_index(identity_of(other), cmap.indexing, cmap.ranks)
            if not choice.ranked:
                if other_uid == uid:
                    self.steps.wait(uid, pod, unranked(cmap))
                    return
                continue
            outcome, claim = self.steps.outcome(other, facts, cluster)
            members.append(Member(other_uid, choice.index, outcome))
            pods[other_uid] = other
            claims[other_uid] = claim
        verdict = decide(cmap, members, self._waited(cmap.key))
        if verdict.bind:
            self._bound(cmap.key)
            self._set_state(cmap.key, None)
            for member_uid, placement in verdict.bind:
                self.steps.send(member_uid, pods[member_uid], placement, claims[member_uid])
            return
        self._set_state(cmap.key, verdict.standing(cmap))
        self._report(cmap.key, uid, pod, pods, verdict)

    def _waiting(self, key: MapKey, uid: str, pod: Pod) -> list[tuple[str, Pod]]:
        """The gang's waiting pods, oldest first, this one included."""
        with self._lock:
            uids = list(self._members.get(key, {}))
        with self.waiting.lock:
            pending = self.waiting.pods
            found = [(u, pending[u]) for u in uids if u in pending]
        if not any(u == uid for u, _ in found):
            found.append((uid, pod))
        return found

    def _waited(self, key: MapKey) -> float:
        now = self.clock()
        return now - self._since.setdefault(key, now)

    def _bound(self, key: MapKey) -> None:
        self._since.pop(key, None)
        if key in self._stuck:
            self._stuck.discard(key)
            self.report_stuck(len(self._stuck))

    def _report(
        self,
        key: MapKey,
        uid: str,
        pod: Pod,
        pods: Mapping[str, Pod],
        verdict: GangVerdict,
    ) -> None:
        """The pod decided reports the gang's status; when the gang turns stuck, every member
        does (the condition and Event of each, once)."""
        assert verdict.status is not None
        self.steps.wait(uid, pod, verdict.status)
        if verdict.stuck and key not in self._stuck:
            self._stuck.add(key)
            self.report_stuck(len(self._stuck))
            self.on_stuck(key, verdict.status.message)
            for other_uid, other in pods.items():
                if other_uid != uid:
                    self.steps.wait(other_uid, other, verdict.status)

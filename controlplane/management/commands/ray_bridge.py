"""`manage.py ray_bridge --address HOST:PORT --control-plane URL`: keep one PEARL node agent on every
eligible node of an existing Ray cluster and tell PEARL what Ray says of its nodes.

About once a second it reads Ray's node table and drains (agents.ray_adapter, the only importer of
Ray), asks core.cluster_events.reconcile what PEARL does not show yet, and does just that: places a
missing agent actor (with a fresh per-node token), binds a registered node to its Ray id, turns a
preemption drain into PEARL's notice with Ray's deadline, another drain into a drain, a dead node
into a node gone at once. It keeps no state of its own: restarted, it reads the same levels again and
changes nothing that is already right (the agent actors are detached: they outlive it). A pass that
finds the database or Ray out of reach is skipped, not fatal: the next one reads the levels again.

Its credential is a bridge token (PEARL_BRIDGE_TOKEN, from `manage.py ray_bridge --issue-token`),
not an operator's: it may issue agent tokens for Ray-named nodes and report their events, nothing else.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connections

from controlplane.core import cluster_events as ce
from controlplane.services import bridges
from controlplane.services.errors import ServiceError


class Command(BaseCommand):
    help = "Bridge an existing Ray cluster to PEARL: one node agent per Ray node; drains and deaths as node events."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS", ""), help="Ray GCS HOST:PORT")
        parser.add_argument(
            "--control-plane",
            default=os.environ.get("PEARL_CONTROL_PLANE", ""),
            help="the URL the agents dial (http://HOST:PORT of Daphne, reachable from every node)",
        )
        parser.add_argument("--token", default="", help="bridge token (prefer env PEARL_BRIDGE_TOKEN)")
        parser.add_argument(
            "--issue-token", metavar="NAME", default="", help="issue a bridge token named NAME, print it and exit"
        )
        parser.add_argument("--engine", choices=["emulated", "torch", "vllm"], default="emulated")
        parser.add_argument("--time-factor", type=float, default=1.0)
        parser.add_argument("--state-root", default="/tmp/pearl-agents", help="agents' state directories, on each node")
        parser.add_argument("--include-head", action="store_true", help="place an agent on the head node too")
        parser.add_argument(
            "--release-drained",
            action="store_true",
            help="hand an elastic node PEARL drained (its pool shrank) back to Ray once its workers are gone: stop "
            "its agent and ask Ray to drain the node as idle (IDLE_TERMINATION), so an autoscaler can remove it",
        )
        parser.add_argument("--interval", type=float, default=1.0, help="seconds between looks at Ray")
        parser.add_argument("--once", action="store_true", help="reconcile once and exit")

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["issue_token"]:
            try:
                self.stdout.write(bridges.issue_bridge_token(name=opts["issue_token"], actor="cli"))
            except ServiceError as exc:
                raise CommandError(str(exc)) from None
            return
        principal = bridges.authenticate_bridge(opts["token"] or os.environ.get("PEARL_BRIDGE_TOKEN", ""))
        if principal is None:
            raise CommandError(
                "no valid bridge token: set PEARL_BRIDGE_TOKEN (manage.py ray_bridge --issue-token NAME)"
            )
        if not opts["address"] or not opts["control_plane"]:
            raise CommandError("--address (Ray) and --control-plane (the URL agents dial) are both needed")
        try:
            from agents import ray_adapter
        except ImportError as exc:
            raise CommandError(f"Ray is not installed ({exc}); pip install -c constraints.txt '.[ray]'") from None
        ray_adapter.connect(opts["address"])
        spec = ray_adapter.NodeAgentSpec(
            control_plane=opts["control_plane"],
            token="",
            dataplane_secret=os.environ.get("PEARL_DATAPLANE_SECRET", ""),
            engine=opts["engine"],
            time_factor=opts["time_factor"],
            state_root=opts["state_root"],
        )
        stopping = False

        def stop(*_: Any) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.log("bridge", address=opts["address"], control_plane=opts["control_plane"], as_=principal.actor)
        db_down = 0.0  # since when the database is out of reach (monotonic), 0 while it answers
        try:
            while not stopping:
                t0 = time.monotonic()
                try:
                    self.reconcile_once(
                        principal,
                        spec,
                        ray_adapter,
                        include_head=opts["include_head"],
                        release_drained=opts["release_drained"],
                    )
                    if db_down:
                        self.log("database_back", after_s=round(time.monotonic() - db_down, 3))
                        db_down = 0.0
                except DatabaseError as exc:  # the database restarting: nothing was half done; look again later
                    if not db_down:
                        self.log("database_unreachable", detail=f"{type(exc).__name__}: {exc}"[:300])
                        db_down = time.monotonic()
                    connections.close_all()  # the next pass opens a fresh connection
                if opts["once"]:
                    break
                time.sleep(max(0.0, opts["interval"] - (time.monotonic() - t0)))
        finally:
            ray_adapter.disconnect()  # the agents stay: they are detached actors

    def reconcile_once(
        self,
        principal: bridges.BridgePrincipal,
        spec: Any,
        adapter: Any,
        *,
        include_head: bool,
        release_drained: bool = False,
    ) -> int:
        try:
            observed, agents = adapter.observe(), adapter.agent_actors()
        except Exception as exc:  # Ray's GCS out of reach (a partition, a head restart): look again later
            self.log("ray_unreachable", detail=f"{type(exc).__name__}: {exc}"[:300])
            return 0
        actions = ce.reconcile(
            observed,
            bridges.ray_nodes(bridge=principal),
            agents,
            include_head=include_head,
            release_drained=release_drained,
        )
        notices: list[ce.Notice] = []  # several nodes drained for preemption: one notice call for all, after the rest
        for action in actions:
            if isinstance(action, ce.Notice):
                notices.append(action)
                continue
            try:
                if isinstance(action, ce.PlaceAgent):
                    token = bridges.agent_token(bridge=principal, ray_node_id=action.node.ray_node_id)
                    adapter.place_agent(action.node, type(spec)(**{**spec.__dict__, "token": token}))
                    self.log(
                        "place_agent",
                        node=ce.pearl_node_name(action.node.ray_node_id),
                        ray_node_id=action.node.ray_node_id,
                        address=action.node.address,
                        gpus=action.node.gpus,
                    )
                elif isinstance(action, ce.Release):
                    self.release(principal, adapter, action)
                else:
                    bridges.apply(bridge=principal, action=action)
                    self.log(type(action).__name__.lower(), **{k: getattr(action, k) for k in action.__slots__})
            except ServiceError as exc:  # refused (e.g. a notice for a node already gone): next look decides again
                self.log("refused", action=type(action).__name__, detail=str(exc))
            except ValueError as exc:  # Ray: an actor of that name appeared meanwhile
                self.log("skipped", action=type(action).__name__, detail=str(exc))
        self.notify(principal, notices)
        return len(actions)

    def notify(self, principal: bridges.BridgePrincipal, notices: list[ce.Notice]) -> None:
        """The preemption notices of one look: several in one call (one transaction, one re-plan per job); if
        that is refused (one node among them may not get a notice), one by one, so only that one is refused."""
        if len(notices) > 1:
            try:
                bridges.preemptions(bridge=principal, notices=notices)
            except ServiceError:
                pass
            else:
                for n in notices:
                    self.log("notice", name=n.name, deadline=n.deadline)
                return
        for n in notices:
            try:
                bridges.apply(bridge=principal, action=n)
                self.log("notice", name=n.name, deadline=n.deadline)
            except ServiceError as exc:
                self.log("refused", action="Notice", detail=str(exc))

    def release(self, principal: bridges.BridgePrincipal, adapter: Any, action: ce.Release) -> None:
        """Stop the node's agent (its workers are gone already; this frees its GPUs in Ray), then ask Ray to
        drain the node as idle. Ray refuses while anything else holds resources there: the next look asks again."""
        try:
            adapter.stop_agent(action.ray_node_id)
            accepted, why = adapter.drain(
                action.ray_node_id, reason="idle_termination", message=f"PEARL released {action.name}"
            )
        except Exception as exc:  # Ray out of reach mid-way: the next look finds the same level and asks again
            self.log("ray_unreachable", detail=f"{type(exc).__name__}: {exc}"[:300])
            return
        bridges.released(bridge=principal, name=action.name, accepted=accepted, why=why)
        self.log("release", name=action.name, ray_node_id=action.ray_node_id, accepted=accepted, rejection=why)

    def log(self, what: str, **data: Any) -> None:
        """One JSON line per action (what a log shipper or a test reads)."""
        data = {("as" if k == "as_" else k): v for k, v in data.items()}
        sys.stdout.write(json.dumps({"t": round(time.time(), 3), "bridge": what, **data}, default=str) + "\n")
        sys.stdout.flush()

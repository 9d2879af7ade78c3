"""The driver link's socket (`/ws/driver/`): a job's rollout driver reports progress, signals, telemetry,
checkpoints and trajectories, asks for the trainer update, and gets what it routes by pushed in full."""

from __future__ import annotations

import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from controlplane.consumers.common import CLOSE_UNAUTHENTICATED, bearer_token, service
from controlplane.core import agent_link as link
from controlplane.core import driver_link as dl
from controlplane.core.wire import ErrorReply, WireError
from controlplane.selectors.driver import job_cluster_view, job_welcome
from controlplane.services import credentials, jobs, progress
from controlplane.services.errors import Conflict, ServiceError
from controlplane.services.events import driver_group
from controlplane.services.trajectories import mark_trained, record_trajectories

log = logging.getLogger(__name__)


class DriverConsumer(AsyncJsonWebsocketConsumer):
    """The driver link: a job's rollout driver (the Pipeline Scheduler) and the Elastic Scheduler.

    The driver authenticates with its job's driver token; `hello` gets the job, the loop's last
    checkpoint and the serving workers; then every change of what it routes by is pushed in full
    (level-triggered). Its progress, signals, telemetry and checkpoints go to services; its job is the
    only one it may speak for. A newer driver of the same job supersedes this socket.
    """

    job_id: int | None = None
    job_name: str = ""
    ready: bool = False
    last_view: dict[str, Any] | None = None

    async def connect(self) -> None:
        job = await database_sync_to_async(credentials.authenticate_driver)(bearer_token(self.scope))
        if job is None:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.job_id, self.job_name = job.pk, job.name
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.job_id is not None:
            await self.channel_layer.group_discard(driver_group(self.job_id), self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        if text_data is None:
            await self._error("bad_message", "messages are JSON text frames")
            return
        try:
            message = dl.DRIVER_LINK.parse(dl.DRIVER_LINK.decode(text_data), dl.DRIVER_MESSAGES)
        except WireError as exc:
            await self._error("bad_message", str(exc))
            return
        try:
            await self._handle(message)
        except ServiceError as exc:
            await self._error(exc.code, exc.message, exc.field or "")
        except Exception:  # a bug must not close the link with 1011: log it, answer, keep serving
            log.exception("driver message for %s failed", self.job_name)
            await self._error("internal_error", "the control plane could not process this message")

    async def _handle(self, message: Any) -> None:
        assert self.job_id is not None
        if isinstance(message, dl.Hello):
            if message.job != self.job_name:
                await self._error(
                    "not_owned", f"this token is job {self.job_name!r}'s, not {message.job[:63]!r}'s", "job"
                )
                return
            await self.channel_layer.group_send(
                driver_group(self.job_id), {"type": "driver.superseded", "by": self.channel_name}
            )
            await self.channel_layer.group_add(driver_group(self.job_id), self.channel_name)
            welcome = await database_sync_to_async(job_welcome)(self.job_id)
            self.ready = True
            self.last_view = dl.DRIVER_LINK.dump(welcome.cluster)
            await self.send_json(dl.DRIVER_LINK.dump(welcome))
            return
        if not self.ready:
            await self._error("not_ready", "send hello first")
            return
        actor = f"driver:{self.job_name}"
        if isinstance(message, dl.ProgressReport):
            await service(progress.report_progress)(job_id=self.job_id, step=message.step, remaining=message.remaining)
        elif isinstance(message, dl.SignalReport):
            await service(progress.report_signal)(
                job_id=self.job_id, signal=message.signal, remaining=message.remaining, actor=actor
            )
        elif isinstance(message, dl.TelemetryReport):
            await service(progress.report_telemetry)(job_id=self.job_id, message=message)
        elif isinstance(message, dl.CheckpointReport):
            await service(progress.save_loop_checkpoint)(job_id=self.job_id, state=message.state)
        elif isinstance(message, dl.TrajectoryReport):  # agent trajectories, for the job page (issue 19)
            await service(record_trajectories)(job_id=self.job_id, step=message.step, trajectories=message.trajectories)
        elif isinstance(message, dl.TrainedReport):  # a step's update committed: its records say so (issue 34)
            await service(mark_trained)(job_id=self.job_id, report=message)
        elif isinstance(message, dl.UpdateRequest):
            try:
                await service(jobs.start_update)(job_id=self.job_id, actor=actor)
            except Conflict as exc:
                await self._error("not_returned" if exc.field == "borrowed" else exc.code, exc.message, exc.field or "")
                return
            await self.send_json(dl.DRIVER_LINK.dump(dl.UpdateGranted(step=message.step)))

    async def driver_changed(self, event: dict[str, Any]) -> None:
        if not self.ready or self.job_id is None:
            return
        view = dl.DRIVER_LINK.dump(await database_sync_to_async(job_cluster_view)(self.job_id))
        if view != self.last_view:
            self.last_view = view
            await self.send_json(view)

    async def driver_superseded(self, event: dict[str, Any]) -> None:
        if event.get("by") != self.channel_name and self.job_id is not None:
            await self.channel_layer.group_discard(driver_group(self.job_id), self.channel_name)
            self.ready = False
            await self._error("superseded", "a newer driver of this job connected")
            await self.close(code=link.CLOSE_SUPERSEDED)

    async def _error(self, code: str, detail: str, field: str = "") -> None:
        await self.send_json(dl.DRIVER_LINK.dump(ErrorReply(error=code[:64], detail=detail[:4096], field=field[:256])))

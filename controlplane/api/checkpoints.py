"""A job's exported checkpoints over REST (issue 36): the list, and one checkpoint's files as a tar stream
(JSON, text and safetensors only: nothing on this wire is a pickle). Thin, as the rest."""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from pathlib import Path

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api.dashboard import OBJECT_LIST
from controlplane.api.params import parse_count, parse_id
from controlplane.selectors.checkpoints import checkpoint_dict, checkpoint_files
from controlplane.selectors.jobs import job_exists
from controlplane.services import checkpoints
from controlplane.services.errors import NotFound

CHUNK = 1 << 20
BLOCK = 512


class JobCheckpointsView(APIView):
    """The job's exported checkpoints, oldest first: step, weight version, when written, size, path, files and
    which tokenizer they carry (as its checkpoint directory holds them now: retention removes the oldest)."""

    @extend_schema(operation_id="jobs_checkpoints_list", responses={200: OBJECT_LIST})
    def get(self, request: Request, pk: str) -> Response:
        job_id = parse_id(pk)
        if not job_exists(job_id):
            raise NotFound(f"job {pk} does not exist", field="id")
        return Response([checkpoint_dict(c) for c in checkpoints.sync(job_id)])


class JobCheckpointDownloadView(APIView):
    """One checkpoint (`latest` or a step) as an uncompressed tar of its files, streamed: a Hugging Face
    directory (`from_pretrained` loads it once unpacked). `pearl export` unpacks it."""

    @extend_schema(
        operation_id="jobs_checkpoints_download", responses={(200, "application/x-tar"): OpenApiTypes.BINARY}
    )
    def get(self, request: Request, pk: str, step: str) -> StreamingHttpResponse:
        job_id = parse_id(pk)
        at = None if step == "latest" else parse_count(step, "step", lo=0, hi=2**31)
        c = checkpoints.find(job_id, at)
        try:
            files = checkpoint_files(c)
        except OSError:
            raise NotFound(f"the checkpoint of step {c.step} was removed meanwhile", field="step") from None
        res = StreamingHttpResponse(_tar(files), content_type="application/x-tar")
        res["Content-Disposition"] = f'attachment; filename="checkpoint-step{c.step}.tar"'
        res["Content-Length"] = str(sum(BLOCK + _padded(size) for _, _, size in files) + 2 * BLOCK)
        res["X-Pearl-Checkpoint-Step"] = str(c.step)
        return res


def _padded(n: int) -> int:
    return -(-n // BLOCK) * BLOCK


def _tar(files: list[tuple[str, Path, int]]) -> Iterator[bytes]:
    """A ustar stream of plain files: a header, the bytes, padding to 512; two empty blocks at the end."""
    for name, path, size in files:
        info = tarfile.TarInfo(name)
        info.size, info.mode = size, 0o644
        yield info.tobuf(format=tarfile.USTAR_FORMAT)
        sent = 0
        with open(path, "rb") as f:
            while sent < size and (chunk := f.read(min(CHUNK, size - sent))):
                sent += len(chunk)
                yield chunk
        if sent < size:  # the file shrank under us: keep the archive's framing (the reader's sizes) whole
            yield bytes(size - sent)
        yield bytes(_padded(size) - size)
    yield bytes(2 * BLOCK)

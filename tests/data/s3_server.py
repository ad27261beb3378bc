"""A real S3-compatible server on loopback for the object-store tests: moto in server mode, a separate process
speaking the S3 HTTP API on a free port of 127.0.0.1 (clients reach it through AWS_ENDPOINT_URL, as they would
any store). Its objects live in its memory, so a restart starts empty; `upload` puts the shards back."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.port}", "AWS_ACCESS_KEY_ID": "testing",
                    "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}

    def start(self, timeout: float = 60.0) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server on port {self.port} did not start") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
            self.proc = None

    def filesystem(self):
        """An s3fs client of this server (the environment set for this process too)."""
        os.environ.update(self.env)
        import s3fs

        return s3fs.S3FileSystem(endpoint_url=self.env["AWS_ENDPOINT_URL"], key="testing", secret="testing",
                                 skip_instance_cache=True)

    def upload(self, local_dir: Path, bucket: str, prefix: str) -> list[str]:
        """local_dir/*.parquet -> s3://bucket/prefix/...; returns the URLs."""
        fs = self.filesystem()
        if not fs.exists(bucket):
            fs.mkdir(bucket)
        urls = []
        for path in sorted(local_dir.glob("*.parquet")):
            fs.pipe(f"{bucket}/{prefix}/{path.name}", path.read_bytes())
            urls.append(f"s3://{bucket}/{prefix}/{path.name}")
        return urls

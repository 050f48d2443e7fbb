"""Repository agents: ``model_repository_agents { agents [ { name, parameters } ] }`` in a
model's config, run in order on the model directory before each load.

Rules of this file:
- ``checksum`` is built in. Each parameter is ``"<ALGORITHM>:<path relative to the model
  directory>"`` -> the expected hex digest. MD5 as Triton's checksum agent; SHA256 too (sluice).
  The algorithm is matched without regard to case, the digest exactly (lower-case hex is what
  is computed), as that agent does. Its refusal texts are the agent's own: "Mismatched MD5
  hash for file 1/model.onnx, expect: <value>, got: <digest>", "failed to open text file for
  read <path>: <OS reason>", "Unsupported checksum algorithm: SHA1", "failed to parse key:
  <key>".
- A path that leaves the model directory (``..``, absolute, a link out of it) is refused
  without being read: nothing outside a repository is read.
- Any other agent name is refused with Triton's text for an agent library it cannot find
  (``unable to find 'libtritonrepoagent_<name>.so' for repo agent '<name>', searched:
  /opt/tritonserver/repoagents``): sluice loads no agent libraries.
- Files are hashed in chunks off the event loop (model files can be gigabytes).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from ..errors import InvalidArgument, Unsupported

__all__ = [
    "AGENT_DIRECTORY",
    "CHECKSUM_ALGORITHMS",
    "check_agents",
    "run_agents",
    "verify_agents",
]

# tritonserver's default --repoagent-directory, named in the refusal of an unknown agent
AGENT_DIRECTORY = "/opt/tritonserver/repoagents"
# lower-cased algorithm name in a parameter key -> (name in messages, hashlib constructor)
CHECKSUM_ALGORITHMS = {"md5": ("MD5", hashlib.md5), "sha256": ("SHA256", hashlib.sha256)}
_CHUNK = 1 << 20


def check_agents(config: mc.ModelConfig) -> None:
    """Refuse an agent sluice does not have (before anything is read)."""
    for agent in config.model_repository_agents.agents:
        if agent.name != "checksum":
            raise InvalidArgument(
                f"unable to find 'libtritonrepoagent_{agent.name}.so' for repo agent "
                f"'{agent.name}', searched: {AGENT_DIRECTORY}"
            )


def _digest(model_dir: Path, relative: str, algorithm: str) -> str:
    _label, make = CHECKSUM_ALGORITHMS[algorithm]
    root = model_dir.resolve()
    path = (root / relative).resolve()
    if os.path.isabs(relative) or not path.is_relative_to(root):
        raise InvalidArgument(
            f"failed to open text file for read {relative}: the path leaves the model directory"
        )
    h = make()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
    except OSError as exc:
        raise InvalidArgument(
            f"failed to open text file for read {relative}: {exc.strerror or exc}"
        ) from None
    return h.hexdigest()


def _checksum(model_dir: Path, parameters: dict[str, str]) -> None:
    for key, expected in sorted(parameters.items()):  # one order for the first refusal
        algorithm, sep, relative = key.partition(":")
        if not sep:
            raise InvalidArgument(f"failed to parse key: {key}")
        if algorithm.lower() not in CHECKSUM_ALGORITHMS:
            raise Unsupported(f"Unsupported checksum algorithm: {algorithm}")
        got = _digest(model_dir, relative, algorithm.lower())
        if got != expected:
            label = CHECKSUM_ALGORITHMS[algorithm.lower()][0]
            raise InvalidArgument(
                f"Mismatched {label} hash for file {relative}, expect: {expected}, got: {got}"
            )


def verify_agents(config: mc.ModelConfig, model_dir: Path) -> None:
    """Run the config's agents in order on ``model_dir`` (blocking: hashes files); the first
    refusal raises. ``sluice repo lint`` calls it as it is."""
    check_agents(config)
    for agent in config.model_repository_agents.agents:
        _checksum(model_dir, dict(agent.parameters))


async def run_agents(config: mc.ModelConfig, model_dir: Path) -> None:
    """``verify_agents`` off the event loop (nothing to do without agents)."""
    if config.model_repository_agents.agents:
        await asyncio.to_thread(verify_agents, config, model_dir)

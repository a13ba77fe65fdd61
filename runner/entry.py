"""What run_spec.py and train_draft.py share around Hydra: bad configs refused in one line each before Hydra
writes to the run directory, the exit status of an interrupted run, console logging, and `--help` built from
conf/'s own comments.

Nothing here imports torch: a mistyped override fails within the interpreter's start-up.

- `ValidateFirst` is a Hydra callback (`hydra.callbacks` in conf/run_spec.yaml, conf/train_draft.yaml): its
  `on_run_start` gets the composed config before `run_job` creates the run directory and saves the new config
  there, so a refused run leaves a reused `hydra.run.dir` (and the valid results in it) as it was. Multirun jobs
  are checked by the task itself (run(), train() validate too).
- `run_task` is the body of both `@hydra.main` functions: config errors as lines on stderr and exit status 2,
  an interrupted run's status 128 + the signal (130 SIGINT, 143 SIGTERM). `HYDRA_FULL_ERROR=1` shows tracebacks.
- `help_text` fills `hydra.help.template` (through the `eaglet_help` resolver): this script's config groups with
  their options and this command's keys with their values, each with its one-line comment from conf/.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

CONF = Path(__file__).resolve().parents[1] / "conf"
log = logging.getLogger("eaglet")
log.setLevel(logging.INFO)  # the run's lines reach Hydra's job log (and the console) whatever the root level


def report_config_errors(fn):
    """fn(); a ConfigError ends the process with its lines on stderr ("error: key=value: ...") and status 2."""
    from eaglet.runner.checks import ConfigError

    try:
        return fn()
    except ConfigError as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        sys.stdout.flush()
        for line in e.lines:
            print(f"error: {line}", file=sys.stderr)
        sys.stderr.flush()
        sys.exit(2)


def job_config(config: DictConfig) -> DictConfig:
    """The task's part of a composed config (what @hydra.main passes the task): without the hydra node."""
    job = config.copy()
    with read_write(job), open_dict(job):
        job.pop("hydra", None)
    return job


class ValidateFirst(Callback):
    """Check the composed config before Hydra creates or writes to the run directory (single runs)."""

    def __init__(self, check: str):
        self.check = check  # dotted path of check(cfg, run_dir): raises ConfigError

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        from hydra.utils import get_method

        run_dir = OmegaConf.select(config, "hydra.run.dir")
        report_config_errors(lambda: get_method(self.check)(job_config(config), run_dir=run_dir))


def run_task(fn, cfg: DictConfig):
    """fn(cfg, Hydra's output dir) -> metrics, as the task of @hydra.main; see the module docstring."""
    from hydra.core.hydra_config import HydraConfig

    from eaglet.runner.signals import Interrupted, exit_code

    try:
        metrics = report_config_errors(lambda: fn(cfg, HydraConfig.get().runtime.output_dir))
    except Interrupted as e:  # before the run had anything of its own to write (loading, data preparation)
        log.warning(f"interrupted by {e.signame} while setting up: no results (what was cached stays)")
        sys.exit(exit_code(e.signame))
    if isinstance(metrics, dict) and metrics.get("interrupted"):
        sys.stdout.flush()
        sys.exit(exit_code(metrics["interrupted"]))
    return metrics


def console_logging() -> None:
    """Outside Hydra (a script or a test calling run() or train() directly) the run's lines still reach the
    console, as Hydra's job logging prints them."""
    if not logging.getLogger().handlers:
        logging.basicConfig(format="[%(name)s] %(message)s")


def rerun_hint(run_dir) -> str:
    """How to continue a stopped run: the same command, in the same run directory."""
    try:
        from hydra.core.hydra_config import HydraConfig

        given = HydraConfig.initialized() and any(o.startswith("hydra.run.dir=")
                                                  for o in HydraConfig.get().overrides.hydra)
    except ValueError:
        given = False
    return "rerun the same command to resume" + ("" if given else f" with hydra.run.dir={run_dir}")


# ---------------------------------------------------------------------------------------------------
# --help from conf/'s comments

_KEY = re.compile(r"^( *)([A-Za-z_][\w\-]*):(.*)$")


def _split_comment(rest: str) -> tuple[str, str]:
    """'value  # comment' -> ('value', 'comment'); a # inside quotes is part of the value."""
    quote = None
    for i, ch in enumerate(rest):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or rest[i - 1] in " \t"):
            return rest[:i].strip(), rest[i + 1:].strip()
    return rest.strip(), ""


def yaml_comments(path: Path) -> tuple[list[str], dict[str, str]]:
    """(the file's header comment lines, {dotted key: its comment}) of one of conf/'s files. A key's comment is
    the one on its line, else the comment lines right above it. The defaults list and the hydra node are skipped."""
    header, docs, stack, above, body = [], {}, [], [], False
    for line in path.read_text().splitlines():
        text = line.strip()
        if text.startswith("#"):
            (above if body else header).append(text.lstrip("#").strip())
            continue
        m = _KEY.match(line)
        if not text or not m:
            above = [] if not text else above
            body = body or bool(text)
            continue
        body = True
        indent, key, rest = len(m[1]), m[2], m[3]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        if stack[0][1] not in ("defaults", "hydra"):
            docs[".".join(k for _, k in stack)] = _split_comment(rest)[1] or " ".join(above)
        above = []
    return [h for h in header if not h.startswith("@package")], docs


def defaults_groups(script: str) -> list[tuple[str, str, str]]:
    """(group, default option, comment) of the script's defaults list, in its order."""
    out = []
    for line in (CONF / f"{script}.yaml").read_text().splitlines():
        m = re.match(r"^\s*-\s*([\w/]+)\s*:\s*([\w.\-]+)(.*)$", line)
        if m:
            out.append((m[1], m[2], _split_comment(m[3])[1]))
    return out


def _leaves(docs: dict[str, str]) -> list[str]:
    return [k for k in docs if not any(other.startswith(k + ".") for other in docs)]


def help_text(script: str, root: DictConfig) -> str:
    """The `--help` of conf/<script>.yaml for the command being composed (`root`: the whole config)."""
    choices = OmegaConf.select(root, "hydra.runtime.choices") or {}
    header, top_docs = yaml_comments(CONF / f"{script}.yaml")
    out = [*header, "", "Config groups (GROUP=OPTION; * = this command's):"]
    groups = defaults_groups(script)
    width = max(len(g) for g, _, _ in [*groups, ('+experiment', '', '')]) + 2
    docs: dict[str, str] = {}
    for group, default, comment in groups:
        chosen = choices.get(group, default)
        out.append(f"  {group:<{width}}{comment}")
        for option in sorted(p.stem for p in (CONF / group).glob("*.yaml")):
            first = (yaml_comments(CONF / group / f"{option}.yaml")[0] or [""])[0]
            out.append(f"  {'':<{width}}{'*' if option == chosen else ' '} {option:<22}{first}")
        if (CONF / group / f"{chosen}.yaml").is_file():
            prefix = group.replace("/", ".")
            docs |= {f"{prefix}.{k}": v for k, v in yaml_comments(CONF / group / f"{chosen}.yaml")[1].items()}
    experiments = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
    if script == "run_spec" and experiments:
        out.append(f"  {'+experiment':<{width}}a whole experiment (a Hydra multirun): {', '.join(experiments)}")
    docs |= top_docs
    keys = [k for k in _leaves(docs) if _has(root, k)]
    rows = [(f"{k}={_raw(root, k)}", docs[k]) for k in keys]
    col = min(max(len(a) for a, _ in rows) + 2, 44)
    out += ["", "Options (KEY=VALUE; the value shown is this command's):"]
    out += [f"  {a:<{col}}{b}" if len(a) < col else f"  {a}\n  {'':<{col}}{b}" for a, b in rows]
    out += ["", f"Overrides compose: python {script}.py GROUP=OPTION KEY=VALUE ...; -m sweeps (KEY=a,b). "
                "--cfg job prints the composed config, --hydra-help Hydra's own options."]
    return "\n".join(out).replace("$", "$$")  # Hydra fills the template with string.Template


def _has(root: DictConfig, key: str) -> bool:
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(root, parent, throw_on_missing=False) if parent else root
    return isinstance(node, DictConfig) and leaf in node


def _raw(root: DictConfig, key: str) -> str:
    """The key's value as written (interpolations unresolved, ??? for a required one)."""
    from eaglet.runner.checks import show

    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(root, parent, throw_on_missing=False) if parent else root
    return show(OmegaConf.to_container(node, resolve=False)[leaf])


def register_help() -> None:
    """`${eaglet_help:<script>}` (hydra.help.template) -> help_text(script, the whole config)."""
    OmegaConf.register_new_resolver("eaglet_help", lambda script, _root_: help_text(script, _root_), replace=True)

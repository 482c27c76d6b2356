"""What reaches a generated sbatch file is one printable line per text: a newline in a path, the
partition, an extra sbatch option, a probe option or an override is refused before anything is
planned or written (one line, exit 2), and the files generated for awkward but legal names (spaces,
quotes, unicode) parse back, as sbatch and bash read them, to exactly the options and command
intended. In-process: the launcher's own code, no scheduler."""

import re
import shlex
from pathlib import Path

import pytest

from slurm.launch import main
from slurm.submit import Resources, check_one_line, train_parameters

DEFAULT = "configs/default.yaml"


def _launch(capsys, *args):
    code = main(
        [
            "--config",
            DEFAULT,
            "--sparse-fractions",
            "0.5",
            "--gpus-per-node",
            "0",
            "--dry-run",
            *args,
        ]
    )
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    "args, what",
    [
        (["--runs-dir", "{tmp}/DIR\ntouch PWNED #"], "--runs-dir"),
        (["--runs-dir", "{tmp}/s", "--partition", "gpu\n#SBATCH --time=1"], "--partition"),
        (["--runs-dir", "{tmp}/s", "--slurm-arg", "account=a\rb"], "--slurm-arg"),
        (["--runs-dir", "{tmp}/s", "--eval-arg", "features.batch_size=8\n"], "--eval-arg"),
        (["--runs-dir", "{tmp}/s", "data.root=/data\tx"], "override"),
    ],
)
def test_a_control_character_is_refused_before_anything_is_written(tmp_path, capsys, args, what):
    code, out, err = _launch(capsys, *[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert code == 2 and out == ""
    assert (
        err.count("\n") == 1 and err.startswith(f"error: {what}: ") and "one printable line" in err
    )
    assert list(tmp_path.iterdir()) == []


def test_a_config_file_named_with_a_newline_is_refused(tmp_path, capsys):
    config = tmp_path / "evil\nname.yaml"
    config.write_text(Path(DEFAULT).read_text())
    code = main(
        ["--config", str(config), "--sparse-fractions", "0.5", "--gpus-per-node", "0", "--dry-run"]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: --config: ") and err.count("\n") == 1


def test_the_job_parameters_are_checked_where_they_are_built():
    params = train_parameters(
        Resources(partition=None, slurm_extra={"comment": "a\nb"}), "s24-train-x"
    )
    with pytest.raises(
        ValueError, match=r"additional_parameters: 'comment=a\\nb' holds the control character"
    ):
        check_one_line(params, Path("/runs/x/slurm/%j"))


def _read_like_sbatch(script: str) -> tuple[dict, list[str]]:
    """({option: value}, command lines) as sbatch and bash read the file: `#SBATCH` options until
    the first line that is neither blank nor a comment, each option line split as a shell word list;
    then bash's non-comment lines."""
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    options, commands, in_header = {}, [], True
    for line in lines[1:]:
        if in_header and line.startswith("#SBATCH"):
            words = shlex.split(line[len("#SBATCH") :])
            assert len(words) == 1 and words[0].startswith("--"), line
            key, _, value = words[0][2:].partition("=")
            options[key] = value
        elif line.strip() and not line.lstrip().startswith("#"):
            in_header = False
            commands.append(line)
    return options, commands


def test_awkward_legal_names_parse_back_to_the_intended_options(tmp_path, capsys):
    runs = tmp_path / "my runs 'q' ü"
    code, out, _ = _launch(
        capsys, "--runs-dir", str(runs), "--partition", "gpu a100", "--slurm-arg", "account=x y"
    )
    assert code == 0
    scripts = re.findall(
        r"^#!/bin/bash\n.*?(?=^# (?:train|eval) job|^\S+\s+run dir|\Z)", out, flags=re.S | re.M
    )
    assert len(scripts) == 2
    folder = str(runs / "sparse_0.50" / "slurm" / "%j")
    for script, name, time in zip(
        scripts, ("s24-train-sparse_0.50", "s24-eval-sparse_0.50"), ("4320", "31")
    ):
        options, commands = _read_like_sbatch(script)
        assert options["job-name"] == name and options["time"] == time
        assert options["partition"] == "gpu a100" and options["account"] == "x y"
        assert options["requeue"] == "" and options["signal"] == "USR2@120"
        assert (
            options["output"] == f"{folder}/%j_0_log.out"
            and options["error"] == f"{folder}/%j_0_log.err"
        )
        srun = shlex.split(commands[-1])
        assert (
            srun[0] == "srun" and srun[-1] == folder
        )  # the job folder is one word, as submitit submits it
        assert srun[srun.index("--output") + 1] == f"{folder}/%j_%t_log.out"

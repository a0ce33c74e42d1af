"""Files are never lost, and odd files never hang or crash a command: the guard on every file
`titan-autopar` and the TorchTitan switch write or clear (`files.check_out_file`,
`check_out_folder`), the checked reader of plans and profiles (`files.read_capped`,
`strict_json`), and how files are written (`files.write_atomic`: modes, temporary names).

CLI cases run `titan-autopar` in this process (exit code 2, one line on stderr, no traceback)
and check that the refusal comes before any work and that the user's file still holds its
bytes. Named pipes are real (os.mkfifo) and every case that meets one runs under an alarm, so
a hang fails the test instead of stopping the suite."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from conftest import tiny_llama
from test_bad_input import cli as run_cli
from titan_autopar import Plan, plan_model
from titan_autopar.fake_mesh import fake_mesh
from titan_autopar.files import FileRefused, check_out_file, write_atomic
from titan_autopar.plan import PlanError, is_plan_file

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "benchmarks/profiles/cpu_gloo_4ranks.json"
AUTO_CONFIG = REPO / "train_configs/llama3_debug_cpu_auto4.toml"
QUIET = dict(progress=lambda s: None)
PLAN_ARGS = ["plan", "--model", "llama3", "--flavor", "debugmodel", "--seq-len", "64",
             "--local-batch-size", "1", "--mesh", "dp_shard=2", "--hardware", "cpu"]
USERS = b'{"schema_version": 3, "theme": "dark", "font": 12}\n'  # a user's own JSON


@contextmanager
def no_hang(seconds: int = 20):
    """Fail, instead of hanging the suite, if the block takes longer than `seconds`."""
    def stop(signum, frame):
        raise TimeoutError(f"still running after {seconds} s: it hangs")
    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def cli(args, capsys) -> tuple[int, str]:
    """`test_bad_input.cli`, stopped by `no_hang` if it ever waits on a pipe."""
    with no_hang():
        return run_cli(args, capsys)


def refused(args, capsys, *says) -> str:
    """The command ends in one line with every one of `says`, exit code 2, before any work."""
    code, text = cli(args, capsys)
    assert code == 2, text
    assert len(text.strip().splitlines()) == 1, text
    assert "[trace]" not in text and "measuring" not in text, text  # nothing planned or measured
    for s in says:
        assert s in text, text
    return text


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory) -> Path:
    """A real plan: a one-layer llama on two simulated ranks."""
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    mesh = fake_mesh(("dp_shard",), (2,))
    plan_model(tiny_llama(dim=64, layers=1, seq=16, n_heads=4), mesh,
               (torch.zeros(2, 16, dtype=torch.long),), **QUIET).save(path)
    return path


@pytest.fixture
def fifo(tmp_path) -> Path:
    p = tmp_path / "pipe.json"
    os.mkfifo(p)
    return p


def _kept(path: Path, content: bytes) -> None:
    assert path.is_file() and path.read_bytes() == content


# ------------------------------------------------------------- plan --out: the guard
@pytest.mark.parametrize("content", [
    USERS,                                              # only a schema_version key in common
    b'{"schema_version": 2, "mesh": {"names": ["dp"]}}',  # a plan's first lines, no plan
    b"# my settings\nlr = 3\n",
], ids=["schema_version-key", "a-plans-first-lines", "not-json"])
def test_plan_out_keeps_a_file_that_is_not_a_plan(content, tmp_path, capsys):
    mine = tmp_path / "settings.json"
    mine.write_bytes(content)
    refused(PLAN_ARGS + ["--out", mine], capsys, f"--out {mine} exists and is not a plan",
            "refusing to overwrite it", "--force")
    _kept(mine, content)


@pytest.mark.parametrize("target, says", [
    ("/dev/null", "is a character device, not a file"),
    ("fifo", "is a named pipe (FIFO), not a file"),
    ("folder", "is a folder: give a file name"),
])
@pytest.mark.parametrize("force", [False, True])
def test_plan_out_is_never_a_device_pipe_or_folder(target, says, force, tmp_path, capsys):
    path = {"/dev/null": Path("/dev/null"), "folder": tmp_path}.get(target)
    if target == "fifo":
        path = tmp_path / "out.json"
        os.mkfifo(path)
    before = os.stat(path)
    refused(PLAN_ARGS + ["--out", path] + (["--force"] if force else []), capsys, says)
    after = os.stat(path)
    assert (after.st_ino, after.st_mode, after.st_rdev) == (before.st_ino, before.st_mode,
                                                             before.st_rdev)


def test_plan_out_through_a_link_to_a_device(tmp_path, capsys):
    link = tmp_path / "plan.json"
    link.symlink_to("/dev/null")
    refused(PLAN_ARGS + ["--out", link, "--force"], capsys, "is a character device")
    assert link.is_symlink() and os.readlink(link) == "/dev/null"


def test_plan_out_with_a_name_too_long_is_refused_before_planning(tmp_path, capsys):
    name = "p" * 251 + ".json"  # 256 bytes: one more than the file system takes
    refused(PLAN_ARGS + ["--out", tmp_path / name], capsys,
            "is 256 bytes, longer than the 255 this file system allows")


def test_plan_out_in_folders_yet_to_make_with_a_name_too_long(tmp_path, capsys):
    refused(PLAN_ARGS + ["--out", tmp_path / "new" / ("d" * 300) / "plan.json"], capsys,
            "is 300 bytes, longer than the 255")
    assert not (tmp_path / "new").exists()


def test_search_outputs_beside_a_long_out_are_checked_before_the_search(tmp_path, capsys):
    """--out of 245 bytes is legal; its block, plan.parallelism.toml beside it, is not."""
    out = tmp_path / ("p" * 240 + ".json")
    refused(["plan", "--config", AUTO_CONFIG, "--hardware", "cpu", "--search", "--out", out],
            capsys, "its [parallelism] block", "longer than the 255")


# ------------------------------------------------------------- written files
@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002], ids=oct)
def test_a_new_plan_gets_the_mode_open_would_give(umask, plan_file, tmp_path):
    old = os.umask(umask)
    try:
        out = Plan.load(plan_file).save(tmp_path / "new.json")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o666 & ~umask


def test_a_replaced_plan_keeps_its_mode(plan_file, tmp_path):
    out = tmp_path / "plan.json"
    shutil.copyfile(plan_file, out)
    os.chmod(out, 0o640)
    Plan.load(plan_file).save(out)
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o640 and is_plan_file(out)


def test_a_profile_gets_the_mode_open_would_give(tmp_path):
    from titan_autopar.cost.profile import (hardware_from_profile, is_profile_file, read_profile,
                                            write_profile)

    doc = read_profile(PROFILE)
    out = write_profile(tmp_path / "profile.json", doc["name"], doc["measured_on"],
                        hardware_from_profile(PROFILE), doc["measurements"])
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o666 & ~_umask()
    assert is_profile_file(out)


def _umask() -> int:
    old = os.umask(0o022)
    os.umask(old)
    return old


@pytest.mark.parametrize("length", [245, 255])
def test_a_plan_with_the_longest_legal_names_is_written(length, plan_file, tmp_path):
    out = tmp_path / ("p" * (length - 5) + ".json")
    assert check_out_file(out, label="--out", what="a plan", ours=is_plan_file) == out
    Plan.load(plan_file).save(out)
    assert Plan.load(out).data == Plan.load(plan_file).data
    assert os.listdir(tmp_path) == [out.name]  # no temporary file left


def test_write_atomic_never_replaces_a_pipe(tmp_path):
    pipe = tmp_path / "p"
    os.mkfifo(pipe)
    with no_hang(), pytest.raises(FileRefused, match="is a named pipe"):
        write_atomic(pipe, "x")
    assert stat.S_ISFIFO(os.stat(pipe).st_mode)


# ------------------------------------------------------------- reading plans
def _edited(plan_file: Path, tmp_path: Path, edit: str) -> Path:
    """The plan's text with `edit` = "old=>new" applied once."""
    old, new = edit.split("=>")
    text = plan_file.read_text()
    assert old in text
    out = tmp_path / "edited.json"
    out.write_text(text.replace(old, new, 1))
    return out


@pytest.mark.parametrize("edit, says", [
    ('"parameters": 12=>"parameters": ' + "9" * 5000,
     "edited.json: fingerprint.parameters: a whole number of 5000 digits"),
    ('"count": =>"count": ' + "7" * 5000 + ", \"x\": ",
     "edited.json: collectives[0].count: a whole number of 5000 digits"),
    ('"memory_budget_gib": =>"memory_budget_gib": ' + "[" * 100_000 + "]" * 100_000 + ", \"x\": ",
     "edited.json is not a plan: its JSON is nested deeper than any plan's"),
], ids=["5000-digits", "5000-digits-in-a-list", "100000-deep"])
def test_absurd_numbers_and_nesting_in_a_plan_name_the_file(edit, says, plan_file, tmp_path,
                                                            capsys):
    bad = _edited(plan_file, tmp_path, edit)
    text = refused(["explain", bad], capsys, says)
    assert "4300" not in text and "set_int_max_str_digits" not in text


@pytest.mark.parametrize("command", [
    ["explain", "{x}"], ["diff", "{plan}", "{x}"], ["show", "{x}", "--out", "{tmp}/p.png"],
], ids=["explain", "diff", "show"])
@pytest.mark.parametrize("odd, says", [
    ("fifo", "is a named pipe (FIFO), not a plan"),
    ("/dev/zero", "is a character device, not a plan"),
    ("folder", "is a folder, not a plan: give the path of a plan"),
    ("huge", "holds more than 256 MiB, more than a plan could hold"),
])
def test_a_plan_argument_that_is_no_file_is_refused_unread(command, odd, says, plan_file,
                                                           tmp_path, capsys):
    x = {"fifo": tmp_path / "pipe.json", "/dev/zero": "/dev/zero", "folder": tmp_path / "plans",
         "huge": tmp_path / "huge.json"}[odd]
    if odd == "fifo":
        os.mkfifo(x)
    elif odd == "folder":
        x.mkdir()
    elif odd == "huge":
        with open(x, "wb") as f:
            f.truncate(300 << 20)  # sparse: 300 MiB on paper, nothing on disk
    args = [a.format(x=x, plan=plan_file, tmp=tmp_path) for a in command]
    refused(args, capsys, f"{x} {says}" if odd != "huge" else says)
    assert not (tmp_path / "p.png").exists()


@pytest.mark.parametrize("command", [
    ["plan", "--config", "{x}", "--out", "{tmp}/p.json"],
    ["ab", "--config", AUTO_CONFIG, "--twin", "{x}", "--out", "{tmp}/ab"],
], ids=["plan-config", "ab-twin"])
def test_a_config_that_is_a_pipe_is_refused_unread(command, fifo, tmp_path, capsys):
    refused([str(a).format(x=fifo, tmp=tmp_path) for a in command], capsys,
            f"{fifo} is not a file: give a TorchTitan TOML config")
    assert sorted(os.listdir(tmp_path)) == ["pipe.json"]


# ------------------------------------------------------------- reading profiles
@pytest.mark.parametrize("odd, says", [
    ("folder", "is a folder, not a hardware profile: give a preset name (h100, h200, a100, "
               "b200, cpu) or a file written by `titan-autopar calibrate --out {x}/profile.json`"),
    ("fifo", "is a named pipe (FIFO), not a hardware profile"),
    ("digits", "hardware.peak_fp32_flops holds a whole number of 5000 digits"),
    ("deep", "the file is not a profile: its JSON is nested deeper than any hardware profile's"),
])
def test_a_hardware_flag_that_is_no_profile_names_the_flag(odd, says, tmp_path, capsys):
    x = tmp_path / ("profiles" if odd == "folder" else "p.json")
    if odd == "folder":
        x.mkdir()
    elif odd == "fifo":
        os.mkfifo(x)
    else:
        doc = json.loads(PROFILE.read_text())
        doc["hardware"]["peak_fp32_flops"] = 0 if odd == "digits" else [0]
        text = json.dumps(doc).replace(
            '"peak_fp32_flops": 0', '"peak_fp32_flops": ' + "1" * 5000, 1).replace(
            '"peak_fp32_flops": [0]', '"peak_fp32_flops": ' + "[" * 100_000 + "]" * 100_000, 1)
        x.write_text(text)
    x_arg = f"{x}/" if odd == "folder" else x
    refused(PLAN_ARGS[:-2] + ["--hardware", x_arg, "--out", tmp_path / "plan.json"], capsys,
            f"--hardware {x_arg}: hardware profile {x_arg}", says.format(x=x))
    assert not (tmp_path / "plan.json").exists()


def test_a_config_hardware_that_is_a_folder_names_the_key(tmp_path, capsys):
    (tmp_path / "profiles").mkdir()
    cfg = tmp_path / "job.toml"
    cfg.write_text(AUTO_CONFIG.read_text().replace('hardware = "calibrate"',
                                                   f'hardware = "{tmp_path}/profiles/"'))
    refused(["plan", "--config", cfg, "--out", tmp_path / "plan.json"], capsys,
            f"{cfg}: [auto_parallel] hardware = '{tmp_path}/profiles/'", "is a folder")


def test_a_job_hardware_that_is_a_folder_names_the_key(tmp_path):
    from torchtitan.config import ConfigManager

    from titan_autopar.cost.profile import ProfileError
    from titan_autopar.titan.job_hardware import resolve_hardware

    (tmp_path / "profiles").mkdir()
    job = ConfigManager().parse_args(["--job.config_file", str(AUTO_CONFIG),
                                      "--auto_parallel.hardware", f"{tmp_path}/profiles/"])
    with pytest.raises(ProfileError) as e:
        resolve_hardware(job)
    assert f"[auto_parallel] hardware = '{tmp_path}/profiles/': hardware profile" in str(e.value)
    assert "is a folder, not a hardware profile" in str(e.value)


# ------------------------------------------------------------- show and calibrate --out
def test_show_replaces_its_own_picture(plan_file, tmp_path, capsys):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from titan_autopar.pictures import save_png
    from titan_autopar.plan_picture import PICTURE_TITLE, is_plan_picture

    ours = tmp_path / "plan.png"
    fig = plt.figure(figsize=(1, 1))
    save_png(fig, ours, PICTURE_TITLE)  # an earlier picture, marked as show marks its own
    plt.close(fig)
    before = ours.read_bytes()
    assert is_plan_picture(ours)
    assert cli(["show", plan_file, "--out", ours], capsys)[0] == 0
    assert ours.read_bytes() != before and is_plan_picture(ours)


def test_show_keeps_a_picture_of_the_users(plan_file, tmp_path, capsys):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    theirs = tmp_path / "holiday.png"
    fig = plt.figure()
    fig.savefig(theirs)  # a picture of the user's own, from matplotlib too
    plt.close(fig)
    data = theirs.read_bytes()
    refused(["show", plan_file, "--out", theirs], capsys, "exists and is not a picture "
            "`titan-autopar show` drew", "--force")
    _kept(theirs, data)


@pytest.mark.parametrize("target, says", [
    ("notes", "exists and is not a hardware profile: refusing to overwrite it"),
    ("/dev/null", "is a character device, not a file"),
    ("folder", "is a folder: give a file name, such as"),
])
def test_calibrate_out_is_checked_before_any_rank_starts(target, says, tmp_path, capsys):
    path = {"notes": tmp_path / "notes.json", "/dev/null": Path("/dev/null"),
            "folder": tmp_path}[target]
    if target == "notes":
        path.write_bytes(USERS)
    refused(["calibrate", "--nproc", "2", "--out", path] + (["--force"] if target != "notes"
                                                             else []), capsys, says)
    if target == "notes":
        _kept(path, USERS)


# ------------------------------------------------------------- the degree search's files
@pytest.fixture
def search_written(plan_file, tmp_path):
    """What `plan --search --out p.json` writes, by the function that writes it."""
    from titan_autopar.solve.search import Candidate, Degrees
    from titan_autopar.titan.degree_search import KEY, SearchResult, table
    from titan_autopar.titan.search_outputs import write_search_outputs

    win = Candidate(Degrees(1, 2, 1), results={"step_s": 0.1, "recipe": "fsdp",
                                               "recipe_step_s": 0.11, KEY: 1234.0,
                                               "peak_gib": 1.5, "recipe_tokens_per_gpu_s": 1100.0})
    aside = Candidate(Degrees(1, 1, 2), reason="tp must divide the heads")
    res = SearchResult(rows=[win, aside], winner=win, job_degrees=Degrees(1, 2, 1), seconds=3,
                       plans={})
    return write_search_outputs(tmp_path / "p.json", Plan.load(plan_file), "job.toml",
                                win.degrees, table(res, "cpu"))


def test_the_search_knows_its_own_files_again(search_written):
    from titan_autopar.titan.search_outputs import check_search_outputs

    assert check_search_outputs(search_written[0], force=False) == search_written


@pytest.mark.parametrize("which, edit, says", [
    (1, "# my degrees\n", "its [parallelism] block"),
    (1, "", "its [parallelism] block"),
    (2, "| notes |\n", "its table"),
])
def test_the_search_keeps_files_beside_out_that_it_did_not_write(which, edit, says,
                                                                 search_written, capsys):
    mine = search_written[which]
    content = (mine.read_text() + edit).encode() if edit else b"data_parallel_shard_degree = 2\n"
    mine.write_bytes(content)
    refused(["plan", "--config", AUTO_CONFIG, "--hardware", "cpu", "--search", "--out",
             search_written[0]], capsys, says, "a search wrote: refusing to overwrite it")
    _kept(mine, content)


# ------------------------------------------------------------- ab --out: a folder it clears
@pytest.fixture(scope="module")
def ab_template(plan_file, tmp_path_factory) -> Path:
    """An earlier A/B's folder as a real one is laid out, from real parts: DCP checkpoints,
    TensorBoard event files, TorchTitan's empty comm_traces, the auto arm's plan, the profile
    measured for it, ab.json and ab.png as `run_ab` writes them."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.utils.tensorboard import SummaryWriter

    from titan_autopar.titan.ab import RESULT_KEYS, _plot

    out = tmp_path_factory.mktemp("ab") / "ab"
    for arm, step in (("seed", 0), ("auto", 3), ("recipe", 3), ("auto_round2", 3)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save({"w": torch.zeros(2)}, no_dist=True,
                     checkpoint_id=str(out / arm / "checkpoint" / f"step-{step}"))
        for suffix in ("", ".titan_autopar"):  # TorchTitan's metrics, and the predictions
            with SummaryWriter(str(out / arm / "tb" / "20260101-1200"),
                               filename_suffix=suffix) as w:
                w.add_scalar("loss", 1.0, 1)
        (out / arm / "comm_traces").mkdir()  # TorchTitan makes it, empty unless tracing
    shutil.copyfile(plan_file, out / "auto" / "plan.json")
    shutil.copyfile(PROFILE, out / "profile.json")
    arm = {"step_time_s": 0.1, "predicted_step_time_s": 0.1}
    result = dict.fromkeys(RESULT_KEYS) | {
        "config": "job.toml", "ranks": 4, "rounds": 1, "auto": arm, "recipe": arm,
        "predicted": {"hardware": "cpu"}}
    write_atomic(out / "ab.json", json.dumps(result))
    _plot(result, {"auto": {1: {"loss": 8.0, "tps": 100.0}},
                   "recipe": {1: {"loss": 8.0, "tps": 90.0}}}, out / "ab.png")
    return out


@pytest.fixture
def earlier_ab(ab_template, tmp_path) -> Path:
    return Path(shutil.copytree(ab_template, tmp_path / "ab"))


def test_an_earlier_ab_is_cleared(earlier_ab):
    from titan_autopar.titan.ab import fresh_folder

    said = []
    fresh_folder(earlier_ab, said.append)
    assert list(earlier_ab.iterdir()) == [] and "cleared the earlier A/B" in said[0]


@pytest.mark.parametrize("mine, says", [
    ("auto/notes.md", "holds auto/notes.md, which an A/B did not write"),
    ("auto/checkpoint/step-3/notes.md", "holds auto/checkpoint"),
    ("recipe/tb/notes.md", "holds recipe/tb"),
    ("auto/results.json", "holds auto/results.json"),
    ("ab.png", "holds ab.png"),
    ("ab.json", "holds ab.json"),
    ("profile.json", "holds profile.json"),
    ("thesis.tex", "holds thesis.tex"),
])
def test_ab_keeps_a_folder_with_anything_it_did_not_write(mine, says, earlier_ab, capsys):
    path = earlier_ab / mine
    content = b"\x89PNG\r\n\x1a\n my drawing" if mine.endswith(".png") else USERS
    path.write_bytes(content)
    refused(["ab", "--config", AUTO_CONFIG, "--out", earlier_ab], capsys, says,
            "refusing to clear it", "--force")
    _kept(path, content)


def test_ab_keeps_a_folder_holding_only_the_users_auto_notes(tmp_path, capsys):
    (tmp_path / "out" / "auto").mkdir(parents=True)
    notes = tmp_path / "out" / "auto" / "notes.md"
    notes.write_text("# what I tried\n")
    refused(["ab", "--config", AUTO_CONFIG, "--out", tmp_path / "out"], capsys,
            "holds auto/notes.md", "refusing to clear it")
    assert notes.read_text() == "# what I tried\n"


def test_ab_out_that_is_a_file_or_pipe(fifo, tmp_path, capsys):
    refused(["ab", "--config", AUTO_CONFIG, "--out", fifo], capsys,
            "is a named pipe (FIFO), not a folder")
    mine = tmp_path / "results.md"
    mine.write_bytes(USERS)
    refused(["ab", "--config", AUTO_CONFIG, "--out", mine, "--force"], capsys,
            "is a file, not a folder")
    _kept(mine, USERS)


def test_ab_force_clears_what_it_did_not_write(earlier_ab):
    from titan_autopar.titan.ab import fresh_folder

    (earlier_ab / "auto" / "notes.md").write_text("old notes")
    fresh_folder(earlier_ab, lambda s: None, force=True)
    assert list(earlier_ab.iterdir()) == []


# ------------------------------------------------------------- the TorchTitan switch
def _job(tmp_path, *extra):
    from torchtitan.config import ConfigManager

    return ConfigManager().parse_args(["--job.config_file", str(AUTO_CONFIG),
                                       "--job.dump_folder", str(tmp_path),
                                       "--auto_parallel.hardware", "cpu", *map(str, extra)])


def _switch(job):
    """The TorchTitan switch on two simulated ranks, as the trainer calls it."""
    from torchtitan.distributed import ParallelDims

    from titan_autopar.titan.parallelize import plan_and_apply

    fake_mesh(("dp_shard",), (2,))
    dims = ParallelDims(dp_replicate=1, dp_shard=2, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=2)
    return plan_and_apply(tiny_llama(dim=64, layers=1, seq=16, n_heads=4), dims, job)


@pytest.mark.parametrize("extra, says", [
    (["--auto_parallel.hardware", "tpu9"], "unknown hardware preset 'tpu9'"),
    (["--auto_parallel.plan_file", "no/such/plan.json"], "which does not exist"),
    (["--auto_parallel.memory_budget_gib", "0.0001", "--training.seq_len", "16"],
     "no plan fits a memory budget of 0.0001 GiB per rank"),
])
def test_the_switch_says_what_to_change(extra, says, tmp_path):
    """What a job under the switch gets for an unknown preset, a plan_file that is not there and
    a budget nothing fits (under torchrun: `tests/test_titan_auto.py`)."""
    with pytest.raises(ValueError) as e:
        _switch(_job(tmp_path, *extra))
    assert says in str(e.value)


@pytest.mark.parametrize("content", [b"my notes\n", USERS], ids=["text", "json"])
def test_save_plan_over_a_users_file_stops_the_job_before_planning(content, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_bytes(content)
    with pytest.raises(FileRefused) as e:
        _switch(_job(tmp_path, "--auto_parallel.save_plan", "notes.txt"))
    assert str(e.value) == (f"[auto_parallel] save_plan = 'notes.txt' ({notes}) exists and is "
                            "not a plan: refusing to overwrite it. Choose another name, or set "
                            "[auto_parallel] save_plan_force = true to replace it")
    _kept(notes, content)


def test_save_plan_force_replaces_a_file_but_never_a_pipe(tmp_path):
    from titan_autopar.titan.parallelize import check_plan_paths

    notes = tmp_path / "notes.txt"
    notes.write_text("old")
    check_plan_paths(_job(tmp_path, "--auto_parallel.save_plan", "notes.txt",
                          "--auto_parallel.save_plan_force"), "", saves=True)
    os.mkfifo(tmp_path / "pipe.json")
    with no_hang(), pytest.raises(FileRefused, match="is a named pipe"):
        check_plan_paths(_job(tmp_path, "--auto_parallel.save_plan", "pipe.json",
                              "--auto_parallel.save_plan_force"), "", saves=True)


def test_save_plan_over_a_plan_is_allowed(plan_file, tmp_path):
    from titan_autopar.titan.parallelize import check_plan_paths

    shutil.copyfile(plan_file, tmp_path / "plan.json")
    check_plan_paths(_job(tmp_path, "--auto_parallel.save_plan", "plan.json"), "", saves=True)


def test_plan_file_that_is_a_folder_says_so(tmp_path):
    from titan_autopar.titan.parallelize import AutoConfigError

    (tmp_path / "plans").mkdir()
    with pytest.raises(AutoConfigError) as e:
        _switch(_job(tmp_path, "--auto_parallel.plan_file", "plans"))
    assert str(e.value) == (f"[auto_parallel] plan_file = 'plans': {tmp_path / 'plans'} is a "
                            f"folder, not a plan: give the plan file in it (such as "
                            f"{tmp_path / 'plans' / 'plan.json'}), or remove plan_file to plan now")


def test_plan_file_that_is_a_pipe_is_refused_unread(fifo, tmp_path):
    with no_hang(), pytest.raises(PlanError) as e:
        _switch(_job(tmp_path, "--auto_parallel.plan_file", fifo.name))
    assert str(e.value).startswith(f"[auto_parallel] plan_file = '{fifo.name}': {fifo} is a "
                                   "named pipe (FIFO), not a plan")

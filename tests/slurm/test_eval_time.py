"""The probe job's time request follows the size of the data it probes (it used to be 12 hours for
every probe, longer than the digits' training job), and a dry run says when data.root is not on this
machine."""

from launcher_helpers import launch

from slurm.eval_time import eval_time_min, probe_images


def test_the_request_grows_with_the_images_from_a_floor(tmp_path):
    assert eval_time_min(0) == 30 and eval_time_min(1797) == 31 and eval_time_min(5001) == 32
    assert eval_time_min(1_281_167 + 50_000) == 30 + 267  # ImageNet-1k: about 5 hours
    for split, n in (("train", 7), ("val", 3)):
        for c in ("a", "b"):
            (tmp_path / split / c).mkdir(parents=True)
        for i in range(n):
            (tmp_path / split / "ab"[i % 2] / f"{i}.JPEG").write_bytes(b"x")
    (tmp_path / "train" / "a" / ".DS_Store").write_bytes(b"x")  # hidden: not an image
    assert probe_images("imagenet_folder", str(tmp_path), ("train", "val")) == 10
    assert (
        probe_images("imagenet_folder", str(tmp_path), ("train", "test")) is None
    )  # no test/ here
    assert probe_images("digits", "", ("train", "val")) == 1797
    assert (
        probe_images("image_folder", str(tmp_path), ("train", "val")) is None
    )  # no labels to probe with


def test_a_link_loop_in_the_data_tree_is_counted_once_and_ends(tmp_path):
    (tmp_path / "train" / "a").mkdir(parents=True)
    (tmp_path / "val" / "a").mkdir(parents=True)
    (tmp_path / "train" / "a" / "0.JPEG").write_bytes(b"x")
    (tmp_path / "val" / "a" / "1.JPEG").write_bytes(b"x")
    (tmp_path / "train" / "a" / "loop").symlink_to(
        tmp_path / "train"
    )  # followed, it would never end
    (tmp_path / "val" / "again").symlink_to(
        tmp_path / "val" / "a"
    )  # the same folder by a second path
    assert probe_images("imagenet_folder", str(tmp_path), ("train", "val")) == 2


def test_a_dry_run_sizes_the_probe_jobs_and_notes_a_root_not_on_this_machine(tmp_path):
    digits = launch(
        "--config",
        "configs/default.yaml",
        "--sparse-fractions",
        "0.5",
        "--runs-dir",
        str(tmp_path / "d"),
        "--dry-run",
    )
    assert "probe jobs ask 31 min for 1,797 images" in digits.stderr
    assert "#SBATCH --time=31" in digits.stdout and "#SBATCH --time=4320" in digits.stdout
    vitl = launch(
        "--config",
        "configs/vitl16_imagenet.yaml",
        "--sparse-fractions",
        "0.7",
        "--runs-dir",
        str(tmp_path / "v"),
        "--dry-run",
        "data.root=/nowhere/imagenet",
    )
    assert "note: data.root=/nowhere/imagenet is not a folder on this machine" in vitl.stderr
    assert "probe jobs ask 720 min: their data is not on this machine" in vitl.stderr
    given = launch(
        "--config",
        "configs/default.yaml",
        "--sparse-fractions",
        "0.5",
        "--runs-dir",
        str(tmp_path / "g"),
        "--dry-run",
        "--eval-timeout-min",
        "45",
    )
    assert "#SBATCH --time=45" in given.stdout and "probe jobs ask" not in given.stderr

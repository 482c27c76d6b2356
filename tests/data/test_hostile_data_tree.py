"""Hostile data trees: entries that are not regular files, symlinks and their loops, and names that
are not UTF-8 or hold control characters. Every case asserts the count, the one warning line, and
that nothing is opened that must not be (data/tree.py states the rules)."""

import logging
import os
import pickle

import numpy as np
import pytest
from hostile_tree_helpers import (
    assert_clean_log,
    base_tree,
    make_fifo,
    make_socket,
    put,
    run_isolated,
)

from data.corrupt import load_image
from data.datasets import CorruptImageError, DatasetError, ImageFolderDataset
from data.tree import DataNotes, printable


def build(root, caplog):
    with caplog.at_level(logging.WARNING):
        ds = ImageFolderDataset(str(root), "train")
    return ds, [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def names(ds):
    return sorted(os.path.relpath(ds.path(i), ds.split_dir) for i in range(len(ds)))


def read_all(ds):
    for i in range(len(ds)):
        image, _ = ds[i]
        assert image.size == (12, 12)


# ------------------------------------------------- entries that are not regular files, links, loops
def test_a_fifo_named_like_an_image_is_counted_never_opened(tmp_path):
    root = base_tree(tmp_path)
    make_fifo(root / "train" / "a" / "pipe.png")
    out = run_isolated(f"""
        import logging; logging.basicConfig(level=logging.WARNING)
        from data.datasets import ImageFolderDataset
        ds = ImageFolderDataset({str(root)!r}, "train")
        for i in range(len(ds)):
            ds[i]
        print("images", len(ds), ds.tree_report.not_regular)
    """)
    assert "images 4 [('a/pipe.png', 'FIFO')]" in out.stdout
    assert (
        "1 entries under" in out.stderr
        and "a/pipe.png (FIFO)" in out.stderr
        and "never opened" in out.stderr
    )


def test_a_socket_and_a_device_link_are_skipped(tmp_path, caplog):
    root = base_tree(tmp_path)
    sock = make_socket(root / "train" / "a" / "s.png")
    os.symlink("/dev/null", root / "train" / "b" / "null.jpg")
    try:
        ds, warnings = build(root, caplog)
    finally:
        sock.close()
    assert len(ds) == 4 and sorted(ds.tree_report.not_regular) == [
        ("a/s.png", "socket"),
        ("b/null.jpg", "character device"),
    ]
    assert (
        len([w for w in warnings if "not regular files" in w]) == 1 and "2 entries" in warnings[0]
    )
    read_all(ds)


def test_dangling_and_self_looping_file_links_are_skipped(tmp_path, caplog):
    root = base_tree(tmp_path)
    os.symlink(tmp_path / "gone.png", root / "train" / "a" / "dangling.png")
    os.symlink("self.png", root / "train" / "a" / "self.png")
    ds, warnings = build(root, caplog)
    assert len(ds) == 4
    assert sorted(ds.tree_report.not_regular) == [
        ("a/dangling.png", "dangling symlink"),
        ("a/self.png", "symlink loop"),
    ]
    assert (
        "dangling.png (dangling symlink)" in warnings[0]
        and "self.png (symlink loop)" in warnings[0]
    )


def test_a_directory_loop_is_listed_once_and_named(tmp_path, caplog):
    root = base_tree(tmp_path)
    os.symlink("..", root / "train" / "a" / "up")  # a/up -> train: would give b's images a's label
    os.symlink(".", root / "train" / "b" / "here")
    ds, warnings = build(root, caplog)
    assert names(ds) == [
        "a/img_0.png",
        "a/img_1.png",
        "b/img_0.png",
        "b/img_1.png",
    ]  # nothing twice
    assert sorted(ds.tree_report.repeated_dirs) == ["a/up", "b/here"]
    line = [w for w in warnings if "second time" in w]
    assert (
        len(line) == 1 and "2 directories" in line[0] and "a/up" in line[0] and "b/here" in line[0]
    )


def test_a_class_that_links_to_another_is_listed_once(tmp_path, caplog):
    root = base_tree(tmp_path)
    os.symlink("a", root / "train" / "c")
    ds, warnings = build(root, caplog)
    assert ds.classes == ["a", "b", "c"] and len(ds) == 4 and ds.tree_report.repeated_dirs == ["c"]
    assert any("class folders of" in w and ": c" in w for w in warnings)


def test_links_to_images_and_folders_outside_are_followed(tmp_path, caplog):
    root = base_tree(tmp_path / "d")
    put(tmp_path / "elsewhere" / "x.png", seed=5)
    os.symlink(tmp_path / "elsewhere" / "x.png", root / "train" / "a" / "linked.png")
    os.symlink(tmp_path / "elsewhere", root / "train" / "b" / "more")
    ds, warnings = build(root, caplog)
    assert names(ds) == [
        "a/img_0.png",
        "a/img_1.png",
        "a/linked.png",
        "b/img_0.png",
        "b/img_1.png",
        "b/more/x.png",
    ]
    assert not warnings
    read_all(ds)


def test_a_directory_named_like_an_image_is_a_folder(tmp_path, caplog):
    root = base_tree(tmp_path)
    put(root / "train" / "a" / "nested.jpg" / "inner.png", seed=3)
    (root / "train" / "b" / "empty.png").mkdir()
    ds, warnings = build(root, caplog)
    assert "a/nested.jpg/inner.png" in names(ds) and len(ds) == 5 and not warnings
    read_all(ds)  # no IsADirectoryError: a folder is never opened as an image


def test_a_file_replaced_by_a_fifo_after_listing_is_refused_without_blocking(tmp_path):
    root = base_tree(tmp_path)
    out = run_isolated(f"""
        import os
        from data.corrupt import load_image
        from data.datasets import CorruptImageError, ImageFolderDataset
        ds = ImageFolderDataset({str(root)!r}, "train")
        os.remove(ds.path(1)); os.mkfifo(ds.path(1))
        try:
            ds[1]
        except CorruptImageError as e:
            print("refused:", e)
        print("skipped", load_image(ds, 1, "skip")[2])
        os.remove(ds.path(2)); os.mkdir(ds.path(2))
        print("skipped", load_image(ds, 2, "skip")[2])
    """)
    assert "refused: cannot read image" in out.stdout and "not a regular file (FIFO)" in out.stdout
    assert out.stdout.count("skipped 1") == 2 and "(directory)" in out.stderr


def test_a_tree_of_nothing_but_special_entries_is_one_clear_error(tmp_path):
    make_fifo(tmp_path / "train" / "a" / "p.png")
    os.symlink(tmp_path / "nowhere.png", tmp_path / "train" / "a" / "d.png")
    with pytest.raises(DatasetError, match="no images under .*expected regular files"):
        ImageFolderDataset(str(tmp_path), "train")


# ------------------------------------------------------------- names: not UTF-8, control characters
FORGED = "x\n2026-01-01 00:00:00 INFO train: done"


@pytest.mark.parametrize(
    "name,shown",
    [
        (FORGED + ".png", "x\\n2026-01-01"),
        ("\x1b[31mred\x1b[0m.png", "\\x1b[31mred"),
        ("carriage\rreturn.png", "carriage\\rreturn"),
        (b"\xff\xfe latin1 \xe9.png", "\\xff\\xfe latin1 \\xe9"),
        ("rtl\u202egnp.exe.png", "rtl\\u202egnp"),
    ],
    ids=["newline", "escape", "carriage-return", "not-utf8", "bidi-override"],
)
def test_hostile_names_load_and_reach_the_log_escaped(tmp_path, caplog, name, shown):
    root = base_tree(tmp_path)
    folder = os.fsencode(root / "train" / "a")
    put(os.path.join(folder, os.fsencode(name)), seed=7)
    put(os.path.join(folder, os.fsencode(name) + b".broken.png"), data=b"not an image")
    ds, _ = build(root, caplog)
    assert len(ds) == 6
    good = [i for i in range(len(ds)) if os.fsencode(ds.path(i)).endswith(os.fsencode(name))]
    assert len(good) == 1 and ds[good[0]][0].size == (12, 12)  # still read, under its real name
    bad = good[0] + 1
    with caplog.at_level(logging.WARNING):
        load_image(ds, bad, "skip")
    line = [r.getMessage() for r in caplog.records if "skipping unreadable image" in r.getMessage()]
    assert len(line) == 1 and shown in line[0], line
    assert_clean_log(caplog.text)
    with pytest.raises(CorruptImageError) as e:
        load_image(ds, bad, "raise")
    assert shown in str(e.value) and e.value.path == ds.path(
        bad
    )  # the message escaped, the path real
    assert_clean_log(str(e.value))


def test_class_folders_with_hostile_names(tmp_path, caplog):
    train = os.fsencode(tmp_path / "train")
    for cls in (b"ok", b"new\nline", b"\xffbyte", b"\x1b[2J"):
        put(os.path.join(train, cls, b"img.png"))
    os.makedirs(os.path.join(train, b"empty\r\xfe"))
    ds, warnings = build(tmp_path, caplog)
    assert len(ds.classes) == 5 and len(ds) == 4
    read_all(ds)
    assert any("class folders of" in w and "empty\\r\\xfe" in w for w in warnings)
    assert_clean_log(caplog.text)


def test_not_image_files_with_hostile_names_are_listed_escaped(tmp_path, caplog):
    root = base_tree(tmp_path)
    put(os.fsencode(root / "train" / "a") + b"/notes\n\xff.txt", data=b"x")
    make_fifo(os.fsencode(root / "train" / "b") + b"/pipe\x1b.png")
    ds, warnings = build(root, caplog)
    assert len(ds) == 4 and any("a/notes\\n\\xff.txt" in w for w in warnings)
    assert any("b/pipe\\x1b.png (FIFO)" in w for w in warnings)
    assert_clean_log(caplog.text)


def test_a_hostile_name_survives_the_data_worker_boundary():
    original = CorruptImageError(
        "/d/train/a/x\n\x1b[31m\udcff.png", "UnidentifiedImageError: cannot identify"
    )
    text = str(original)
    assert "\n" not in text and "x\\n\\x1b[31m\\xff.png" in text
    wrapped = (
        "Caught CorruptImageError in DataLoader worker process "
        "0.\nTraceback:\ndata.datasets.CorruptImageError: "
    )
    again = CorruptImageError(wrapped + text)  # what PyTorch rebuilds in the main process
    assert str(again) == text and again.reason == original.reason
    assert str(pickle.loads(pickle.dumps(original))) == text


def test_printable_is_idempotent_and_leaves_plain_unicode_alone():
    for text in ("plain/ünïcødé/日本.png", "a\nb\x1bc\rd\udcfe\u202e\x00", "back\\slash"):
        once = printable(text)
        assert printable(once) == once and once.isprintable()
    assert printable("plain/ünïcødé/日本.png") == "plain/ünïcødé/日本.png"
    assert printable("a\x00b") == "a\\x00b"


def test_warnings_from_before_the_log_file_are_logged_again(caplog):
    quiet = logging.getLogger("hostile.quiet")
    quiet.propagate = (
        False  # no handler anywhere: as when train.py builds the dataset before log.txt exists
    )
    notes = DataNotes()
    notes.warn("3 entries under /d are not regular files", quiet)
    assert notes.log_again(quiet) == 0  # still nowhere to go
    quiet.propagate = True  # logging configured (caplog's handler on the root)
    with caplog.at_level(logging.WARNING):
        assert notes.log_again(quiet) == 1 and notes.log_again(quiet) == 0
    assert (
        "3 entries under /d are not regular files (found while building the dataset" in caplog.text
    )
    assert np.array_equal(notes.lines, ["3 entries under /d are not regular files"])


def test_a_dangling_link_or_fifo_where_a_class_would_be_is_counted(tmp_path, caplog):
    root = base_tree(tmp_path)
    os.symlink(tmp_path / "unmounted", root / "train" / "c")
    os.symlink("loop", root / "train" / "loop")
    make_fifo(root / "train" / "d")
    ds, warnings = build(root, caplog)
    assert ds.classes == ["a", "b"] and len(ds) == 4
    assert sorted(ds.tree_report.not_regular) == [
        ("c", "dangling symlink"),
        ("d", "FIFO"),
        ("loop", "symlink loop"),
    ]
    assert len(warnings) == 1 and "3 entries under" in warnings[0]


def test_a_plain_tree_keeps_torchvisions_order(tmp_path):
    """Indices of a tree without hostile entries are the ones torchvision's make_dataset gave
    (checkpoints store sample-stream positions, so a run resumed under this version must see the
    same images at the same indices)."""
    from torchvision.datasets.folder import make_dataset

    from data.datasets import IMG_EXTENSIONS

    root = base_tree(tmp_path, per_class=3)
    for rel in (
        "a/sub/z.png",
        "a/sub/deeper/y.png",
        "a/sub-2/x.JPG",
        "a/0.png",
        "b/Sub/B.png",
        "b/sub/a.png",
        "a/.hidden.png",
    ):
        put(root / "train" / rel)
    os.symlink(root / "train" / "b" / "sub", root / "train" / "a" / "linked")
    ds = ImageFolderDataset(str(root), "train")
    split = str(root / "train")
    expected = make_dataset(split, {"a": 0, "b": 1}, extensions=IMG_EXTENSIONS)
    # make_dataset lists b/sub twice (once through a/linked); ours once, under the first path met
    assert [ds.path(i) for i in range(len(ds))] == [
        p for p, _ in expected if not p.startswith(split + "/b/sub")
    ]
    assert ds.tree_report.repeated_dirs == ["b/sub"]

"""The CLIs reject bad flags with a clear message (exit code 2) before any compute."""

import os

import pytest

from experiments import dpdfd as dpdfd_cli
from experiments import dpsgd as dpsgd_cli
from experiments import teacher as teacher_cli


@pytest.mark.parametrize("main,argv,match", [
    (teacher_cli.main, ["--dataset=imagenet"], "unknown dataset 'imagenet'"),
    (teacher_cli.main, ["--model=gpt"], "unknown model 'gpt'"),
    (teacher_cli.main, ["--num_shards=2", "--shard=5"], "shard must be in"),
    (dpdfd_cli.main, ["--dataset=digits", "--teacher_dirs=x", "--noise_multiplier=0",
                      "--target_epsilon=1"], "needs noise"),
    (dpdfd_cli.main, ["--dataset=digits", "--teacher_dirs=x", "--noise_multiplier=1",
                      "--l2_clip_norm=0"], "l2_clip_norm"),
    (dpdfd_cli.main, ["--dataset=digits", "--teacher_dirs=x", "--noise_multiplier=1",
                      "--delta=2"], "delta"),
    (dpsgd_cli.main, ["--dataset=digits", "--model=lenet5", "--norm=batch", "--steps=1",
                      "--noise_multiplier=1"], "BatchNorm"),
])
def test_bad_flags_exit_with_message(main, argv, match, capsys):
  with pytest.raises(SystemExit) as exit_info:
    main(argv)
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert match in err and err.count("\n") == 1  # one line, no usage block


def test_dpdfd_asks_for_privacy_flags_once_the_data_is_there(tmp_path, capsys):
  # found (read later): the privacy flags come next (cifar10 has no recipe file giving them)
  (tmp_path / "cifar10.npz").write_bytes(b"")
  with pytest.raises(SystemExit) as exit_info:
    dpdfd_cli.main(["--dataset=cifar10", f"--data_dir={tmp_path}"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert "give noise_multiplier, target_epsilon" in err and err.count("\n") == 1


def test_dpdfd_missing_teacher_dir_is_clear(tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    dpdfd_cli.main(["--dataset=digits", f"--teacher_dirs={tmp_path}/none", "--noise_multiplier=1",
                    f"--workdir={tmp_path}/run", "--no_progress"])
  assert exit_info.value.code == 2
  assert "--teacher_dirs" in capsys.readouterr().err and not os.path.exists(tmp_path / "run")

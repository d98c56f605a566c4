"""How many NPUs the emulator provides: the variable, the run option, torchrun's default."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import ascend_patch_emulator as emulator
import pytest
import torch
from ascend_patch_emulator._activate import DEVICES_VARIABLE
from ascend_patch_emulator._activate import MAX_DEVICES
from ascend_patch_emulator._activate import resolve_device_count
from ascend_patch_emulator.doctor import VARIABLES

from ascend_patch_core._cli.run import EMULATED_DEVICES_VAR
from ascend_patch_core._cli.run import MAX_EMULATED_DEVICES


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv(DEVICES_VARIABLE, raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    return monkeypatch


def test_default_is_one_then_torchruns_local_world_size_then_the_variable(clean_env):
    assert resolve_device_count() == 1
    clean_env.setenv("LOCAL_WORLD_SIZE", "4")
    assert resolve_device_count() == 4
    clean_env.setenv(DEVICES_VARIABLE, "6")
    assert resolve_device_count() == 6
    assert resolve_device_count(2) == 2  # an explicit count wins
    clean_env.setenv(DEVICES_VARIABLE, "zero")
    with pytest.raises(ValueError, match=DEVICES_VARIABLE):
        resolve_device_count()
    clean_env.setenv(DEVICES_VARIABLE, "0")
    with pytest.raises(ValueError, match="positive"):
        resolve_device_count()


def test_the_count_is_bounded_by_torch_s_8_bit_device_index(clean_env):
    """99999999999 NPUs used to pass, then fail with a bare MemoryError; 128 is torch's limit."""
    assert torch.device("cpu", MAX_DEVICES - 1).index == MAX_DEVICES - 1
    assert torch.device("cpu", MAX_DEVICES).index != MAX_DEVICES  # wraps around
    assert MAX_EMULATED_DEVICES == MAX_DEVICES  # run --emulated-devices says the same bound
    clean_env.setenv(DEVICES_VARIABLE, str(MAX_DEVICES))
    assert resolve_device_count() == MAX_DEVICES
    for value in (str(MAX_DEVICES + 1), "99999999999", "\u0661"):  # the last: an Arabic-Indic 1
        clean_env.setenv(DEVICES_VARIABLE, value)
        with pytest.raises(ValueError, match=f"at most {MAX_DEVICES}"):
            resolve_device_count()
    with pytest.raises(ValueError, match=f"at most {MAX_DEVICES}"):
        resolve_device_count(MAX_DEVICES + 1)
    clean_env.delenv(DEVICES_VARIABLE)
    clean_env.setenv("LOCAL_WORLD_SIZE", "99999999999")  # not torchrun's: the default instead
    assert resolve_device_count() == 1


def test_activation_reads_the_environment(clean_env):
    if emulator.is_active():
        pytest.skip("needs its own activation")
    clean_env.setenv("LOCAL_WORLD_SIZE", "3")
    with emulator.activate() as handle:
        assert handle.device_count == 3 == torch.npu.device_count()
        torch.npu.set_device(2)
        assert torch.zeros(1, device="npu:2").is_npu
        torch.npu.set_device(0)


def test_invalid_ordinal_names_what_the_user_can_do(clean_env):
    if emulator.is_active():
        pytest.skip("needs its own activation")
    with emulator.activate():
        for attempt in (lambda: torch.npu.set_device(1), lambda: torch.ones(1, device="npu:1")):
            with pytest.raises(RuntimeError) as caught:
                attempt()
            message = str(caught.value)
            assert "invalid NPU device ordinal 1" in message
            assert "--emulated-devices N" in message and DEVICES_VARIABLE in message
            assert "LOCAL_WORLD_SIZE" in message


def test_the_variable_is_one_name_and_doctor_knows_it():
    assert EMULATED_DEVICES_VAR == DEVICES_VARIABLE
    assert "run --emulated-devices" in VARIABLES[DEVICES_VARIABLE]


SCRIPT = textwrap.dedent(
    """
    import torch
    torch.cuda.set_device(1)  # an unmodified CUDA program choosing its second GPU
    x = torch.ones(2, device="cuda")
    print(torch.cuda.device_count(), torch.cuda.current_device(), x.is_npu)
    """
)


def _run(tmp_path, *options, env_extra=None):
    script = tmp_path / "pick_device.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in (DEVICES_VARIABLE, "LOCAL_WORLD_SIZE")}
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "ascend_patch_core._cli", "run", *options, str(script)],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )


def test_run_option_sets_the_count_for_the_program(tmp_path):
    out = _run(tmp_path, "--emulate-npu", "--emulated-devices", "2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "1", "True"]


def test_run_without_enough_devices_says_how_to_get_them(tmp_path):
    out = _run(tmp_path, "--emulate-npu")
    assert out.returncode == 1
    assert "invalid NPU device ordinal 1" in out.stderr
    assert "--emulated-devices N" in out.stderr
    out = _run(tmp_path, "--emulate-npu", env_extra={DEVICES_VARIABLE: "2"})
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--emulated-devices", "2"), "--emulate-npu"),
        (("--emulate-npu", "--emulated-devices=0"), "positive"),
    ],
)
def test_run_option_usage_errors(tmp_path, options, message):
    out = _run(tmp_path, *options)
    assert out.returncode == 2
    assert message in out.stderr

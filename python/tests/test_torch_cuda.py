"""mp.torch on a CUDA device (CTest python_torch_cuda, labels gpu and
python; skipped without a device): the small GPT-2 of gpt2_case.py trained
on the GPU through DLPack on the device, the units' work on the engine's
compute stream, against the same run on the CPU: fp32 losses within 1e-4
relative at every step (the GPU's kernels sum in other orders), and
bf16_master within the bf16 band."""
import copy

import pytest
import torch

import gpt2_case as case
import mp
import mp.torch

mp.init()

if not torch.cuda.is_available():
    pytest.skip("no CUDA device: torch.cuda.is_available() is False", allow_module_level=True)


@pytest.mark.parametrize("recipe, tolerance", [("RECIPE_FP32", 1e-4), ("BF16_MASTER", 2e-2)])
def test_the_gpu_trains_as_the_cpu(recipe, tolerance):
    model = case.make_model()
    on_gpu = copy.deepcopy(model).cuda()
    cpu = case.sharded(model, recipe=recipe)
    gpu = mp.torch.Sharded(mp.torch.gpt2_units(on_gpu), loss=mp.torch.causal_lm_loss, data=case.batch,
                           config=case.config_text(recipe=recipe), device="cuda", root=on_gpu)
    assert gpu.engine.device.startswith("cuda")
    for s in range(1, 6):
        want, got = cpu.step().loss, gpu.step().loss
        assert abs(got - want) <= tolerance * want, f"step {s}: GPU {got}, CPU {want}"
    cpu.close()
    gpu.close()

"""mp.torch.shard on a CUDA device (CTest python_torch_cuda under mpirun,
python_torchrun_cuda under torchrun: NCCL over Gloo; labels gpu and python;
skipped without a device): the small GPT-2 of gpt2_case.py trained
in the test's own loop on the GPU (the gathered buffers through DLPack on
the device, torch's stream and the engine's ordered by events), against
the same loop on the CPU: fp32 losses within 1e-4 relative at every step
(the GPU's kernels sum in other orders), and bf16_master within the bf16
band."""
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
    cpu = mp.torch.shard(model, config=case.config_text(recipe=recipe))
    gpu = mp.torch.shard(on_gpu, config=case.config_text(recipe=recipe), device="cuda")
    assert gpu.engine.device.startswith("cuda")
    for s in range(5):
        tokens = case.batch(s)
        model(tokens, labels=tokens).loss.backward()
        on_gpu(tokens.cuda(), labels=tokens.cuda()).loss.backward()
        want, got = cpu.step().loss, gpu.step().loss
        assert abs(got - want) <= tolerance * want, f"step {s + 1}: GPU {got}, CPU {want}"
    cpu.close()
    gpu.close()

"""GPU placement. The tests that need a CUDA device are marked ``gpu`` and skipped where torch
sees none (CI never has one); the CPU fallback runs everywhere."""

from __future__ import annotations

import pytest

from evalq.worker.runtime_pool import resolve_device

torch = pytest.importorskip("torch")


def test_auto_is_cpu_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert resolve_device("auto", 3) == "cpu"
    assert resolve_device("cuda:1", 0) == "cuda:1"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_one_worker_process_per_gpu() -> None:
    count = torch.cuda.device_count()
    devices = [resolve_device("auto", index) for index in range(2 * count)]
    assert devices == [f"cuda:{i % count}" for i in range(2 * count)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_demo_model_runs_on_the_gpu() -> None:
    from evalq.shared.evaluation import create, load_plugins

    load_plugins([])
    topic = create("topic")
    encoder, anchors = topic.load(resolve_device("auto"))
    assert anchors.device.type == "cuda"
    outputs = topic.infer((encoder, anchors), [{"text": "The striker scored twice."}])
    assert outputs[0]["label"] == "sports"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_isolated_inference_holds_the_model_on_the_gpu_in_its_own_process() -> None:
    from evalq.shared.evaluation import create, load_plugins
    from evalq.worker.model_proxy import ModelProxy

    load_plugins([])
    topic = create("topic")
    device = resolve_device("auto")
    proxy = ModelProxy(topic, device=device, plugins=[], threads=None, timeout=600).start()
    try:
        outputs = proxy.infer([{"text": "The striker scored twice."}, {"text": "Rain all day."}])
    finally:
        proxy.close()
    assert [o["label"] for o in outputs] == ["sports", "weather"]
    assert torch.cuda.memory_allocated() == 0  # the model lived in the subprocess

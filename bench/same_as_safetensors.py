"""The byte check the bench scripts share: loaded tensors against `safetensors`' own load of the file."""


def check(path: str, loaded: dict, label: str) -> None:
    """Raises SystemExit naming the first tensor of ``loaded`` (name → tensor, any device) whose shape or bytes
    differ from `safetensors`' load of ``path``, or a tensor missing from it."""
    import torch
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        for k in f.keys():
            if k not in loaded:
                raise SystemExit(f"{label}: {k} is missing from the load")
            want, got = f.get_tensor(k), loaded[k].cpu()
            # Compared as bytes: random bits hold NaNs, which equal nothing as numbers.
            same = want.shape == got.shape and torch.equal(want.reshape(-1).view(torch.uint8),
                                                           got.reshape(-1).view(torch.uint8))
            if not same:
                raise SystemExit(f"{label}: {k} differs from safetensors' load")

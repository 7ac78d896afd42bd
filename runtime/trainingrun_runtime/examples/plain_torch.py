"""The shortest picture of the SDK's contract: plain PyTorch, recorded checkpoints, exact resume, the notice."""

import torch

from trainingrun_runtime import sdk


def batch(seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step N's batch depends on N alone, so a resumed run trains on what an uninterrupted one would."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(256, 32, generator=g)
    return x, torch.sin(x @ torch.linspace(-1, 1, 32, dtype=x.dtype)).unsqueeze(1)


def main() -> int:
    run = sdk.attach()  # what the operator passed this attempt
    steps, seed = int(run.trainer.get("steps", 200)), int(run.trainer.get("seed", 0))
    lr = float(run.trainer.get("grpo", {}).get("lr", 1e-3))
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    start = 0
    if (resume := run.resume_dir()) is not None:  # the newest recorded checkpoint, every checksum verified
        state = torch.load(resume / "state.pt", weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    for step in range(start + 1, steps + 1):
        x, y = batch(seed, step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        run.report(step, loss=loss.item())  # progress: status, kubectl get, the stall watchdog
        if run.should_save(step) or step == steps:  # every savePeriod steps, and on the head's notice
            with run.checkpoint(step, final=step == steps) as directory:  # recorded only if this block completes
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
                torch.save(state, directory / "state.pt")
        if run.notice:  # the head pod is going: the newest checkpoint answers, exit PREEMPTED
            run.stop()
    run.finish(steps)
    return sdk.OK


if __name__ == "__main__":
    raise SystemExit(main())

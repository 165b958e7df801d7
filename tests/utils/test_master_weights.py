"""fp32 master weights for bf16 parameters: the masters follow fp32 AdamW exactly; plain AdamW on bf16 weights
loses most small updates (the bug the masters fix); state_dict round trip; outside writes restart the master."""
import torch

from mmgrpo.utils.master_weights import MasterWeightAdamW, make_adamw

KW = dict(lr=1e-5, weight_decay=0.01, betas=(0.9, 0.999))


def _weights(n=2000, seed=0):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 0.02


def _grads(k, n=2000):
    """A consistent direction plus noise (a real gradient keeps its sign for a while): Adam moves ~lr per step."""
    g0 = torch.randn(n, generator=torch.Generator().manual_seed(99))
    return [g0 + 0.3 * torch.randn(n, generator=torch.Generator().manual_seed(100 + i)) for i in range(k)]


def _run(opt, p, grads):
    for g in grads:
        opt.zero_grad()
        p.grad = g.to(p.dtype)
        opt.step()


def test_masters_follow_fp32_adamw_and_bf16_weights_are_their_rounding():
    w, grads = _weights(), _grads(10)
    # reference: fp32 AdamW on the bf16-rounded start, fed the same (bf16-rounded) gradients
    ref = torch.nn.Parameter(w.bfloat16().float())
    _run(torch.optim.AdamW([ref], **KW), ref, [g.bfloat16().float() for g in grads])
    p = torch.nn.Parameter(w.bfloat16())
    opt = make_adamw([p], **KW)
    assert isinstance(opt, MasterWeightAdamW)
    _run(opt, p, grads)
    assert p.dtype == torch.bfloat16 and opt.masters[0].dtype == torch.float32
    assert torch.equal(opt.masters[0], ref.detach())  # same arithmetic, same process: bitwise
    assert torch.equal(p.detach(), ref.detach().bfloat16())
    # the updates reached the bf16 weights (w moved ~1e-4 in 10 steps; half a bf16 ulp at |w|=0.02 is 6e-5)
    assert (p.detach() != w.bfloat16()).float().mean() > 0.5


def test_plain_adamw_on_bf16_weights_loses_updates():
    """Why the masters exist: the same 10 steps applied directly to bf16 weights change far fewer of them."""
    w, grads = _weights(), _grads(10)
    p = torch.nn.Parameter(w.bfloat16())
    opt = make_adamw([p], master_weights=False, **KW)
    assert type(opt) is torch.optim.AdamW
    _run(opt, p, grads)
    assert (p.detach() != w.bfloat16()).float().mean() < 0.3


def test_fp32_params_get_plain_adamw_and_mixed_lists_copy_only_half():
    a = torch.nn.Parameter(torch.ones(3))
    assert type(make_adamw([a], **KW)) is torch.optim.AdamW
    b = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    opt = make_adamw([a, b], **KW)
    assert opt.masters[0] is a and opt.masters[1] is not b


def test_state_dict_round_trip_continues_the_fp32_trajectory():
    w, grads = _weights(), _grads(6)
    p = torch.nn.Parameter(w.bfloat16())
    opt = MasterWeightAdamW([p], **KW)
    _run(opt, p, grads)  # uninterrupted: 6 steps
    full = opt.masters[0].clone()
    q = torch.nn.Parameter(w.bfloat16())
    o1 = MasterWeightAdamW([q], **KW)
    _run(o1, q, grads[:3])
    sd = o1.state_dict()
    saved_q = q.detach().clone()
    r = torch.nn.Parameter(w.bfloat16())  # a fresh process: weights loaded from the checkpoint, then the optimizer
    with torch.no_grad():
        r.copy_(saved_q)
    o2 = MasterWeightAdamW([r], **KW)
    o2.load_state_dict(sd)
    _run(o2, r, grads[3:])
    assert torch.equal(o2.masters[0], full)  # without the saved masters the sub-ulp progress would be lost
    assert torch.equal(r.detach(), full.bfloat16())


def test_a_weight_written_from_outside_restarts_its_master():
    p = torch.nn.Parameter(_weights().bfloat16())
    opt = MasterWeightAdamW([p], lr=0.0, weight_decay=0.0)
    with torch.no_grad():
        p.fill_(0.5)  # e.g. a broadcast from rank 0 or a checkpoint load
    p.grad = torch.zeros_like(p)
    opt.step()
    assert torch.equal(p.detach(), torch.full_like(p, 0.5)) and torch.equal(opt.masters[0], torch.full((2000,), 0.5))

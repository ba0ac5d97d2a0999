"""Routing near-ties in transformers' LFM2-MoE: the margin between the k-th and (k+1)-th expert
score, where a one-ulp difference between two correct implementations picks another expert.
Shared by make_goldens.py and hf_answers.py."""
import torch


def margins(module, args, kwargs):
    """Per token, the k-th minus the (k+1)-th selection score (sigmoid + expert bias) of one
    Lfm2MoeTopKRouter call (a forward hook's args); None when k covers every expert."""
    hidden = args[0]
    bias = args[1] if len(args) > 1 else kwargs.get("expert_bias")
    scores = torch.sigmoid(torch.nn.functional.linear(hidden, module.weight))
    if module.use_expert_bias:
        scores = scores + bias
    k = module.top_k
    if k >= scores.shape[-1]:
        return None
    top = torch.topk(scores, k + 1, dim=-1).values
    return top[:, k - 1] - top[:, k]


def hook_routers(model, on_margins):
    """Calls on_margins(per-token margins) after every router call; returns the hook handles."""
    def hook(module, args, kwargs, _out):
        m = margins(module, args, kwargs)
        if m is not None:
            on_margins(m)
    return [m.register_forward_hook(hook, with_kwargs=True) for m in model.modules()
            if type(m).__name__ == "Lfm2MoeTopKRouter"]

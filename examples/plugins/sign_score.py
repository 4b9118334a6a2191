"""A CoBo variant as one new part and one preset: Eq. (1) scored by the sign of the two
gradients' inner product (each sample moves w_ij by exactly gamma), the rest raycobo's.

    raycobo run examples/quickstart.yaml plugin_paths=[examples/plugins] \
        algorithm.preset=sign_score:SIGN
"""

import torch

from raycobo.algorithms.cobo import register_preset, register_score


@register_score("sign")
def sign(G_i: torch.Tensor, G_j: torch.Tensor, floor: float = 0.0) -> torch.Tensor:
    """+1 where the two ends' gradients point the same way, -1 where they oppose."""
    return torch.sign(torch.linalg.vecdot(G_i, G_j))


SIGN = register_preset("sign", base="raycobo", alignment="sign")

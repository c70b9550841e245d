"""The widget panel, ``kit.panel(scenario=1|2)``: controls that drive an instant estimate, and measured runs.

Its rooms: ``build`` (the panel), ``views`` (its HTML views), ``models`` (its model list and box), ``advice``
(the advisor in it), ``gpus`` (more than one GPU), ``runs`` (what its runs share, and sweeps), ``stages`` (Run,
each stage beside its estimate) and ``run_view`` (drawing them).
"""
from kit.widgets.build import Panel, panel

__all__ = ["panel", "Panel"]

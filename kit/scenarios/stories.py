"""Each scenario's story on the panel, registered with it (:func:`kit.widgets.build.register_story`): scenario 1's
head control (:mod:`.custom_head.panel_head`), scenario 2's fold loop (:mod:`.cross_validation.panel_folds`).
``kit.panel`` imports this module before it builds a panel."""
from kit.scenarios.cross_validation.panel_folds import FoldLoop
from kit.scenarios.custom_head.panel_head import HeadChoice
from kit.widgets.build import register_story

register_story(1, HeadChoice)
register_story(2, FoldLoop)

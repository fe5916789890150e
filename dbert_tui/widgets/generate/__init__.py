"""The Generate screen's parts, one widget per job (screens/generate.py composes them).

    player.py     Player         the status line; the runs' workers, their frames, play/pause/step/scrub, infill
    canvas.py     Canvas         one sample large; the text drawn, its token positions, double spacing
    grid.py       SampleGrid     several samples, a card each; selection marks, cards below the fold
    compare.py    CompareView    two settings side by side (one seed, separate draws), side A and B
    inspector.py  TokenInspector the token under the cursor (panel), InspectorLine (one line)
    editor.py     Editor         the draft, its locks, versions (undo/redo), refill and branch
    controls.py   Controls       the legend and the control bar; settings keys and dialogs, colouring, layout

The App owns the shared state (the checkpoint, the controller.Session); a widget reads it from
`self.app`, sets none of the Session's fields and keeps the rest of its state itself. A widget
tells the screen what happened by posting a message upward (messages.py: RunAdvanced,
InfillChosen, SampleChosen, TokenPointed) or returning it; the screen asks the Session for the
change, calls widgets' methods downward and draws. A widget never imports a screen, and no
module here is over 400 lines (tests/test_architecture.py).
"""

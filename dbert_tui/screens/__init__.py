"""The app's screens: Generate (main), Checkpoints, Train, and small dialogs."""

"""Training: one SFT loop over sequences that carry their own positions, mask and targets, so each
system trains with exactly the visibility and position ids its engine will use at inference."""

"""What a trial trains on: models (catalog entries or tiny local ones) and prompt datasets."""

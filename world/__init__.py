"""The ranking world and its measured value and cost curves (real numpy compute)."""

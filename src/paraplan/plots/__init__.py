"""Figures: one house style; every figure is saved as PNG and PDF."""

"""Tests for zinc."""

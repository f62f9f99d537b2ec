"""Running submissions in isolation, scoring them, and writing reports."""

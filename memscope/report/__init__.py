"""The one runtime-report builder, shared by the live session and ``memscope analyze``."""

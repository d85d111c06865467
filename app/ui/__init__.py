"""The Qt desktop window (PySide6 + pyqtgraph), on top of the core and the adapters."""

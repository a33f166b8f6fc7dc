"""The engine, private: the process table, the effect step, the journal, transitions and
recovery. Only the face (``ringzero.core.kernel``, ``context``, ``handles``, ``routing``)
imports it; see ARCHITECTURE.md."""

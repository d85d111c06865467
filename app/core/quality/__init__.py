"""Quality: whether a smaller quantization still does the user's job.

Modules: ``suite`` (the records), ``suite_reading`` / ``suite_writing`` (YAML and JSON in and out),
``suite_checks`` and ``suite_similarity`` (judging answers), ``divergence`` (KL divergence and
perplexity change against a reference), ``evidence`` (intervals and paired tests), ``chat`` (chat
templates rendered as llama-server does) and ``quant_compare`` (the recommendation).

Task suites: prompts with checks on the answers, for choosing a quantization by the user's own task.

A suite is a named list of prompts, each with a check on what the model answers. FitScope runs
every prompt greedily on a few quantized variants of one model and reports the pass rate per
suite, so a user sees whether a smaller quantization still does their job.

Suites are YAML or JSON files (the built-in ones live in ``resources/suites``)::

    name: capitals
    description: Short factual answers.
    task: chat                      # chat, summarization, extraction, tool_call or custom
    quality_floor: 0.8              # optional: the pass rate a deployment needs (0..1)
    prompts:
      - id: france
        prompt: "Question: What is the capital of France?\\nAnswer:"
        max_tokens: 16              # optional, 96 by default
        check: {contains: Paris}    # exact, contains or regex; add case_sensitive: true if case matters
      - id: age
        prompt: "Text: Maria is 34.\\nJSON: {"
        answer_prefix: "{"          # put back in front of the answer before checking (the prompt opened it)
        check:
          json_schema: {type: object, required: [age], properties: {age: {const: 34}}}
      - id: the-same-age
        prompt: "Text: Maria is 34.\\nJSON: {"
        answer_prefix: "{"
        check: {fields: {name: Maria, age: 34}}     # these keys with these values; others are ignored
      - id: timer
        prompt: "Tool: set_timer(minutes: integer)\\nUser: 15 minutes, please.\\nCall: {"
        answer_prefix: "{"
        check: {tool_call: {name: set_timer, arguments: {minutes: 15}}}
      - id: summary
        prompt: "Article: ...\\nSummary in one sentence:"
        check:
          similar: ["The council will close the unsafe library.", "An unsafe library is to close."]
          threshold: 0.5            # optional, 0.4 by default

``check: {contains: Paris}`` is short for ``check: {kind: contains, value: Paris}``,
``json_schema: {...}`` for ``kind: json_schema`` with ``schema: {...}``, ``similar: ...`` for
``kind: similar`` with ``references: [...]``, ``tool_call: {...}`` for ``kind: tool_call`` with
``call: {...}`` and ``fields: {...}`` for ``kind: fields``; both forms are read.

Value checks (``fields``, ``tool_call``) compare JSON values by meaning: text ignores case (unless
``case_sensitive``), surrounding and repeated whitespace and a final period; numbers compare as
numbers (34 and 34.0 are equal, "34" is not a number); lists compare as collections in any
order; nested objects field by field. A tool call must name the function and give exactly the
expected arguments: a missing, wrong or extra argument fails, as it would when the call reached
the real tool.

``similar`` judges free text against one or more reference answers by content-word F1 (see
``similarity``): the share of content words the answer and a reference have in common, as the
harmonic mean of precision and recall, after dropping function words and word endings. Word
order is ignored on purpose: a summary that says the same thing in another order is as good. The
best score over the references counts. Only the answer's opening is judged (as many paragraphs as
the reference has, after a lead-in line ending in ":"), so a base model that writes its summary
and then goes on with the next article is judged by its summary, not by what it restates after.

Prompts go through the model's chat template when it has one (see ``app.adapters.suite_runner``),
else as raw completions; the built-in prompts read well either way.

Every problem in a suite text is a SuiteError naming the line at fault and what to change.

The parts, by job: :mod:`app.core.suite_model` (the records and their validation),
:mod:`app.core.suite_reading` (parsing, loading, the built-in suites), :mod:`app.core.suite_writing`
(YAML for the editor, prompts from the user's examples), :mod:`app.core.suite_checks` (judging
answers, pass rates) and :mod:`app.core.suite_similarity` (content-word F1). The names the rest of
FitScope uses are importable from here.
"""

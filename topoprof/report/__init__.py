"""The report stage. Takes the JSON payloads of the stages before it and gives what people read:
report.json, report.md and PNG charts (`files`), terminal text (`text_*`), the verdict on the
measured bandwidth and the advice with the numbers behind it.

  files           write (and re-render) a scan report
  markdown        report.md
  text_bench, text_model, text_validate, text_scan, text_profile   what the commands print
  verdict         is the measured busbw normal for these links?
  recommend       what to do, ranked by predicted gain
  plots           every chart (matplotlib imported only when drawing)
"""

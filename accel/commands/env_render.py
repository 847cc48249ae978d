"""`accel env`'s text form: the collected facts (:func:`accel.sysinfo.collect_environment`) as
aligned sections, each probe's error shown in its place."""

from __future__ import annotations

from typing import Any

from accel.sysinfo import ONECCL_MODULE, is_error

__all__ = ["render_text"]


Rows = list[tuple[str, str]]


def render_text(env: dict[str, Any]) -> str:
    """Sections of aligned ``key  value`` lines, for people."""
    sections: list[tuple[str, Rows]] = [
        ("accel", _rows(env.get("accel"), [("version", "version"), ("location", "location")])),
        ("torch", _torch_rows(env.get("torch"))),
        ("python", _rows(env.get("python"), [("version", "version"), ("implementation", "implementation"), ("executable", "executable")])),
        ("platform", _rows(env.get("platform"), [("os", "platform"), ("machine", "machine"), ("host", "host")])),
        ("cpu", _cpu_rows(env.get("cpu"))),
        ("packages", _package_rows(env.get("packages"))),
        ("backends (probe order)", _backend_rows(env.get("backends"), env.get("selected_backend"))),
    ]
    backends = env.get("backends")
    if isinstance(backends, list):
        for info in backends:
            if info.get("available") and not info.get("error"):
                sections.append((f"backend {info.get('name')}", _backend_detail_rows(info)))
    sections += [
        ("distributed", _distributed_rows(env.get("distributed"))),
        ("run plan (without Accelerator arguments)", _run_plan_rows(env.get("run_plan"))),
        ("deepspeed", _deepspeed_rows(env.get("deepspeed"))),
        ("plug-ins", _plugin_rows(env.get("plugins"))),
        ("environment variables", _env_var_rows(env.get("environment_variables"))),
        ("config file", _config_rows(env.get("config_file"))),
    ]
    width = min(max((len(key) for _, rows in sections for key, _ in rows), default=0), 28)
    lines = []
    for title, rows in sections:
        lines.append(title)
        for key, value in rows:
            lines.append(f"  {key:<{width}}  {value}".rstrip())
        lines.append("")
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if is_error(value):
        return f"error: {value['error']}"
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(_fmt(v) for v in value) or "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_fmt(v)}" for k, v in value.items()) or "-"
    return str(value)


def _bytes(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _fmt(value)
    return f"{value / 2**30:.1f} GiB"


def _section_error(section: Any) -> Rows | None:
    if is_error(section) or not isinstance(section, (dict, list)):
        return [("error", _fmt(section) if is_error(section) else f"unexpected value {section!r}")]
    return None


def _rows(section: Any, fields: list[tuple[str, str]]) -> Rows:
    return _section_error(section) or [(label, _fmt(section.get(key))) for label, key in fields]


def _torch_rows(section: Any) -> Rows:
    error = _section_error(section)
    if error:
        return error
    git = section.get("git_version")
    return [
        ("version", _fmt(section.get("version"))),
        ("build", _fmt(section.get("build"))),
        ("git version", git[:12] if isinstance(git, str) else _fmt(git)),
        ("debug build", _fmt(section.get("debug"))),
        ("location", _fmt(section.get("location"))),
    ]


def _cpu_rows(section: Any) -> Rows:
    error = _section_error(section)
    if error:
        return error
    return [
        ("model", _fmt(section.get("model"))),
        ("architecture", _fmt(section.get("architecture"))),
        ("logical cores", _fmt(section.get("logical_cores"))),
        ("physical cores", _fmt(section.get("physical_cores"))),
        ("usable cores", _fmt(section.get("usable_cores"))),
        ("torch threads", _fmt(section.get("torch_threads"))),
        ("memory", _bytes(section.get("memory_total"))),
    ]


def _package_rows(section: Any) -> Rows:
    error = _section_error(section)
    if error:
        return error
    return [(name, "not installed" if version is None else _fmt(version)) for name, version in section.items()]


def _backend_rows(backends: Any, selected: Any) -> Rows:
    rows = _section_error(backends)
    if rows is None:
        rows = []
        for info in backends:
            state = "available" if info.get("available") else "not available"
            text = f"{state}: {info.get('reason') or '(no reason given)'}"
            if info.get("error"):
                text += f" (describe failed: {info['error']})"
            rows.append((str(info.get("name")), text))
    if is_error(selected) or not isinstance(selected, dict):
        rows.append(("selected", _fmt(selected)))
    elif selected.get("error"):
        rows.append(("selected", f"error: {selected['error']} (from {selected.get('source')})"))
        if selected.get("note"):
            rows.append(("precedence", str(selected["note"])))
    else:
        how = f"from {selected['source']}" if selected.get("source") not in (None, "detected") else "first available in probe order"
        rows.append(("selected", f"{selected.get('name')} ({how})"))
        if selected.get("note"):
            rows.append(("precedence", str(selected["note"])))
    return rows


def _deepspeed_rows(info: Any) -> Rows:
    if is_error(info) or not isinstance(info, dict):
        return [("state", _fmt(info))]
    if not info.get("installed"):
        return [("installed", "no")]
    if info.get("asked") is False:
        return [("installed", "yes (its accelerator choice was not asked for)")]
    rows: Rows = [("version", _fmt(info.get("version"))), ("DS_ACCELERATOR", _fmt(info.get("ds_accelerator")))]
    if info.get("error"):
        return rows + [("accelerator", f"error: {info['error']}")]
    rows += [("accelerator", f"{info.get('device')} ({info.get('class')}), collectives {info.get('communication_backend')}")]
    agreement = info.get("agreement") or {}
    verdict = {True: "agrees with accel", False: "DISAGREES with accel", None: "not compared"}[agreement.get("agree")]
    rows.append(("vs accel", verdict))
    rows += [("  problem", text) for text in agreement.get("problems") or []]
    rows += [("  note", text) for text in agreement.get("notes") or []]
    return rows


_DETAIL_SKIP = {"name", "device_type", "available", "reason", "priority", "devices", "capabilities"}
_DEVICE_SKIP = {"index", "name", "total_memory", "driver_version", "runtime_version", "extra", "error"}


def _backend_detail_rows(info: dict[str, Any]) -> Rows:
    rows: Rows = [(key.replace("_", " "), _fmt(value)) for key, value in info.items() if key not in _DETAIL_SKIP]
    for device in info.get("devices") or []:
        label = f"device {device.get('index', '?')}"
        if device.get("error"):
            rows.append((label, f"error: {device['error']}"))
            continue
        summary = [_fmt(device.get("name")), _bytes(device.get("total_memory"))]
        for key in ("driver_version", "runtime_version"):
            if device.get(key):
                summary.append(f"{key.split('_')[0]} {device[key]}")
        rows.append((label, ", ".join(summary)))
        extra = dict(device.get("extra") or {})
        extra.update({k: v for k, v in device.items() if k not in _DEVICE_SKIP})  # plug-in additions
        rows += [(f"  {key.replace('_', ' ')}", _fmt(value)) for key, value in extra.items()]
    capabilities = info.get("capabilities")
    if isinstance(capabilities, dict):
        rows.append(("capabilities", ""))
        for key, cap in capabilities.items():
            if isinstance(cap, dict) and "supported" in cap:
                text = f"{'yes' if cap['supported'] else 'no ':<3}  {cap.get('reason') or ''}"
            else:
                text = _fmt(cap)
            rows.append((f"  {key}", text))
    return rows


def _distributed_rows(section: Any) -> Rows:
    error = _section_error(section)
    if error:
        return error
    rows = [("torch.distributed", "available" if section.get("available") else "not available in this torch build")]
    collectives = section.get("backends")
    if isinstance(collectives, dict):
        for name, ok in collectives.items():
            rows.append((name, "unknown (this torch has no probe)" if ok is None else _fmt(ok)))
    else:
        rows.append(("backends", _fmt(collectives)))
    oneccl = section.get(ONECCL_MODULE)
    rows.append(("oneCCL bindings", _fmt(oneccl) if is_error(oneccl) else ("installed" if oneccl else "not installed")))
    rows.append(("default per device", _fmt(section.get("default_device_backend_map"))))
    return rows


def _run_plan_rows(section: Any) -> Rows:
    error = _section_error(section)
    if error:
        return error
    rows = [("strategy", section.get("strategy")), ("distributed type", section.get("distributed_type")),
            ("processes", f"{section.get('num_processes')} ({section.get('launcher')})")]
    rows += [(f"why ({key})", value) for key, value in (section.get("reasons") or {}).items()]
    fp8 = section.get("fp8")
    if isinstance(fp8, dict):
        rows.append(("fp8", f"{fp8['mode']}: {fp8.get('reason')}" if fp8.get("mode") else f"refused: {fp8.get('refused')}"))
    return rows


def _plugin_rows(section: Any) -> Rows:
    error = _section_error(section)
    if error:
        return error
    rows = [("entry points", _fmt(section.get("entry_points")) if section.get("entry_points") else "none installed")]
    for item in section.get("errors") or []:
        rows.append(("load error", f"{item.get('entry_point')}: {item.get('error')}"))
    return rows


def _env_var_rows(section: Any) -> Rows:
    error = _section_error(section)
    if error:
        return error
    return [(name, value) for name, value in section.items()] or [("(none set)", "")]


def _config_rows(section: Any) -> Rows:
    error = _section_error(section)
    if error:
        return error
    rows = [("path", _fmt(section.get("path"))), ("exists", _fmt(section.get("exists")))]
    if section.get("problem"):
        rows.append(("problem", section["problem"]))
    for key, value in (section.get("contents") or {}).items():
        rows.append((f"  {key}", _fmt(value)))
    return rows

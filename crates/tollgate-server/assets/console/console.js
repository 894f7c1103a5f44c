// The tollgate console: keeps the pasted key in sessionStorage (this tab only), sends it as a
// bearer token to the console's reads under /v1/console/, and builds every element with the DOM
// API (text is always set as text, never parsed as markup). Charts arrive as SVG drawn on the
// server and are parsed as SVG documents.
"use strict";

(function () {
  const KEY = "tollgate.console.key";
  const $ = (id) => document.getElementById(id);
  const TITLES = {
    overview: "Overview", backlog: "Backlog", execution: "Execution",
    finance: "Finance", audit: "Audit", keys: "Keys",
  };
  let session = null;

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "class") node.className = value;
      else if (name.startsWith("data-")) node.setAttribute(name, String(value));
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  function text(value) {
    if (value === null || value === undefined || value === "") return "—";
    return String(value);
  }

  function table(headers, rows, attrs) {
    const head = el("tr", {}, headers.map((h) => el("th", { class: h.num ? "num" : null }, h.label || h)));
    return el("table", attrs || {}, el("thead", {}, head), el("tbody", {}, rows));
  }

  // When an audit check ran, and whether this answer is the server's last check of the scope
  // (checks of a scope run at most once per cache_ms on one server).
  function checkedHint(check, id) {
    return el("p", { id: id, class: "hint" }, "Checked " + check.checked_at +
      (check.cached ? " (this server's last check; checks run at most every " + Math.round(check.cache_ms / 1000) + " s)" : ""));
  }

  function kv(pairs) {
    return el("table", { class: "kv" }, el("tbody", {}, pairs.map(([k, v]) =>
      el("tr", {}, el("th", {}, k), el("td", {}, v instanceof Node ? v : text(v))))));
  }

  function card(title, ...children) {
    return el("section", { class: "card" }, el("h2", {}, title), children);
  }

  // What a chart may not carry, whatever the server sent (defence in depth under the CSP, which
  // already refuses inline script): elements that run script, embed documents or change
  // attributes over time, elements outside the SVG namespace, event handler attributes, and
  // attribute values that are script or data URLs (data URLs of raster images excepted) or
  // styles that load URLs.
  const SVG_DROPPED = new Set(["script", "foreignobject", "iframe", "embed", "object", "set",
    "animate", "animatemotion", "animatetransform", "discard", "handler", "listener"]);
  const RASTER_DATA = /^data:image\/(png|gif|jpeg|webp)[;,]/;

  function unsafeValue(name, value) {
    // Browsers skip whitespace and control characters inside a URL's scheme.
    const v = String(value).replace(/[\u0000-\u0020\u007f]+/g, "").toLowerCase();
    if (v.includes("javascript:") || v.includes("vbscript:")) return true;
    if (v.startsWith("data:") && !RASTER_DATA.test(v)) return true;
    if (name === "style" && (v.includes("url(") || v.includes("expression("))) return true;
    return false;
  }

  function sanitizeSvg(root) {
    for (const node of [root, ...root.querySelectorAll("*")]) {
      if (node !== root && (!(node instanceof SVGElement) || SVG_DROPPED.has(node.localName.toLowerCase()))) {
        node.remove();
        continue;
      }
      for (const attr of [...node.attributes]) {
        const name = attr.localName.toLowerCase();
        if (name.startsWith("on") || unsafeValue(name, attr.value)) {
          node.removeAttributeNode(attr);
        }
      }
    }
    return root;
  }

  function svg(source) {
    const doc = new DOMParser().parseFromString(source, "image/svg+xml");
    const root = doc.documentElement;
    if (!(root instanceof SVGSVGElement)) return el("p", {}, "chart unavailable");
    return el("div", { class: "chart" }, document.importNode(sanitizeSvg(root), true));
  }

  function showError(message) {
    const box = $("error");
    box.textContent = message;
    box.hidden = !message;
  }

  async function api(method, path, body) {
    const key = sessionStorage.getItem(KEY);
    const init = { method, headers: { Authorization: "Bearer " + key }, cache: "no-store" };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path, init);
    if (!response.ok) {
      let message = "HTTP " + response.status;
      try {
        const answer = await response.json();
        message = answer.error.code + ": " + answer.error.message;
      } catch (_) { /* not JSON */ }
      const error = new Error(message);
      error.status = response.status;
      throw error;
    }
    return response;
  }

  const getJson = async (path) => (await api("GET", path)).json();
  const postJson = async (path, body) => (await api("POST", path, body)).json();

  function route() {
    const hash = location.hash.replace(/^#/, "");
    const [page, ...rest] = hash.split("/");
    return { page: page || "overview", arg: rest.length ? decodeURIComponent(rest.join("/")) : "" };
  }

  function buildNav() {
    const nav = $("nav");
    nav.replaceChildren();
    const current = route().page;
    for (const page of session.pages) {
      nav.append(el("a", { href: "#" + page, id: "nav-" + page, class: page === current ? "current" : null }, TITLES[page] || page));
    }
    $("who").textContent = session.role + " · " + session.scope;
    $("forget").hidden = false;
  }

  async function render() {
    showError("");
    const view = $("view");
    if (!session) return;
    const { page, arg } = route();
    if (!session.pages.includes(page)) {
      view.replaceChildren(el("p", {}, "This key may not open that page."));
      return;
    }
    buildNav();
    view.replaceChildren(el("p", { class: "hint" }, "Loading…"));
    try {
      const pages = { overview, backlog, execution, finance, audit, keys };
      const content = await pages[page](arg);
      view.replaceChildren(content);
      view.setAttribute("data-page", page);
      view.setAttribute("data-ready", String(Date.now()));
    } catch (error) {
      view.replaceChildren();
      showError(error.message);
    }
  }

  // ---- overview ----------------------------------------------------------------------------
  async function overview() {
    const o = await getJson("/v1/console/overview");
    const outcomes = Object.entries(o.calls.by_outcome);
    const spendRows = o.spend.map((s) => el("tr", { "data-consumer": s.consumer },
      el("td", {}, s.consumer),
      el("td", { class: "num settled" }, s.settled),
      el("td", { class: "num held" }, s.held),
      el("td", { class: "num" }, text(s.daily_warn)),
      el("td", { class: "num" }, text(s.daily_block)),
      el("td", {}, s.currency),
      el("td", { class: "level-" + s.level }, s.level)));
    const limitCell = (used, limit) => el("td", { class: "num" }, limit == null ? String(used) : used + " / " + limit);
    const limitRows = o.limits.map((l) => el("tr", { "data-consumer": l.consumer },
      el("td", {}, l.consumer),
      limitCell(l.requests, l.limits.requests_per_minute),
      limitCell(l.input_tokens, l.limits.input_tokens_per_minute),
      limitCell(l.output_tokens, l.limits.output_tokens_per_minute),
      limitCell(l.in_flight, l.limits.in_flight),
      el("td", {}, text(l.window_ends_at)),
      el("td", { class: "level-" + (l.level === "limited" ? "block" : "ok") }, l.level)));
    const held = Object.entries(o.holds.held).map(([c, a]) => a + " " + c).join(", ");
    const sched = o.scheduler;
    return el("div", { id: "overview" },
      el("h2", {}, "Overview · " + o.scope + " · " + o.day),
      card("Calls per minute (last " + o.calls.window_minutes + " minutes)",
        svg(o.calls.chart_svg),
        el("p", { id: "calls-by-outcome" }, outcomes.length
          ? outcomes.map(([k, v]) => k + ": " + v).join(" · ")
          : "No calls ended in this window."),
        o.calls.partial ? el("p", { class: "hint" }, "Older rows of the window were not read.") : null),
      card("Today's spend per consumer",
        table(["consumer", { label: "settled", num: true }, { label: "held", num: true },
          { label: "daily warn", num: true }, { label: "daily block", num: true }, "currency", "level"],
        spendRows, { id: "spend" })),
      o.limits.length ? card("Limits per consumer (this minute's window)",
        table(["consumer", { label: "requests", num: true }, { label: "input tokens", num: true },
          { label: "output tokens", num: true }, { label: "in flight", num: true }, "window ends", "level"],
        limitRows, { id: "limits" })) : null,
      card("Open work",
        kv([
          ["open holds", el("span", { id: "holds" }, o.holds.count + (held ? " (" + held + ")" : "") + (o.holds.truncated ? "+" : ""))],
          ["backlog (awaiting an operator)", el("span", { id: "backlog-count" }, o.backlog + (o.backlog_truncated ? "+" : ""))],
        ])),
      card("Scheduler (this process)",
        kv([
          ["passes", sched.passes],
          ["failed tasks", sched.failed_tasks],
          ["last pass", text(sched.last_pass_at) + (sched.last_pass_at ? " (" + sched.last_pass_ms + " ms)" : "")],
          ["scheduled ledger audits", sched.ledger_audit_runs + " (last found " + sched.ledger_violations_last + " violations)"],
        ])),
      card("Ledger audit",
        el("p", { id: "ledger-status", class: o.ledger.ok ? "status-ok" : "status-bad" },
          o.ledger.ok ? "clean" : o.ledger.violations_total + " violations"),
        o.ledger.first_violation ? el("p", {}, "First: ", el("code", {}, o.ledger.first_violation)) : null,
        checkedHint(o.ledger, "ledger-checked")));
  }

  // ---- backlog -----------------------------------------------------------------------------
  const CLASSES = ["input", "output", "cache_read", "cache_write", "reasoning"];

  function resolveForm(item, container) {
    const inputs = {};
    const fields = CLASSES.map((c) => {
      inputs[c] = el("input", { type: "number", min: "0", step: "1", value: "0", name: c, id: "usage-" + c, required: true });
      return el("label", {}, c, inputs[c]);
    });
    const out = el("div", { class: "quote-area" });
    const usage = () => {
      const u = {};
      for (const c of CLASSES) {
        const v = inputs[c].value.trim();
        if (!/^[0-9]+$/.test(v)) throw new Error(c + " must be a whole number of tokens");
        u[c] = Number(v);
      }
      return u;
    };
    const useEvidence = el("button", { type: "button", id: "use-evidence", disabled: !item.latest_evidence }, "Use latest evidence");
    useEvidence.addEventListener("click", () => {
      for (const c of CLASSES) inputs[c].value = String(item.latest_evidence.usage[c]);
    });
    const form = el("form", { class: "inline", id: "resolve-form" }, fields, useEvidence,
      el("button", { type: "submit", id: "quote" }, "Show the charge"));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      showError("");
      try {
        const stated = usage();
        const q = await postJson("/v1/console/backlog/" + item.execution_id + "/quote", { usage: stated });
        const confirm = el("button", { type: "button", class: "danger", id: "confirm-resolve" },
          "Charge " + q.amount + " " + q.currency);
        confirm.addEventListener("click", async () => {
          confirm.disabled = true;
          try {
            const view = await postJson("/v1/admin/executions/" + item.execution_id + "/resolve", { usage: stated });
            out.replaceChildren(el("p", { id: "resolved", class: "status-ok" },
              "Resolved: " + view.state + ", charged " + view.receipt.amount + " " + view.receipt.currency));
            const row = document.querySelector("tr[data-operation-key=\"" + CSS.escape(item.operation_key) + "\"]");
            if (row) row.remove();
            form.remove();
          } catch (error) {
            showError(error.message);
            confirm.disabled = false;
          }
        });
        out.replaceChildren(el("div", { class: "quote", id: "quote-result", "data-amount": q.amount },
          el("p", {}, "Resolving with this usage will charge ", el("strong", { id: "quote-amount" }, q.amount + " " + q.currency),
            " (price version " + q.price_version + ") and release the hold of " + q.hold + " " + q.currency + "."),
          confirm));
      } catch (error) {
        showError(error.message);
      }
    });
    container.replaceChildren(el("h2", {}, "Resolve " + item.operation_key + " with stated usage"), form, out);
  }

  // Settling from stored evidence: a dry run shows the amount, the confirmation settles once
  // (POST /v1/admin/reconcile/resolve-from-evidence, the operator's audited route).
  function evidenceForm(item, container) {
    const out = el("div", { class: "quote-area" });
    const dry = el("button", { type: "button", id: "evidence-dry-run" }, "Show the charge");
    const reason = (it) => it ? (it.reason || it.action) : "no answer";
    dry.addEventListener("click", async () => {
      showError("");
      dry.disabled = true;
      try {
        const report = await postJson("/v1/admin/reconcile/resolve-from-evidence",
          { keys: [item.operation_key], dry_run: true });
        const planned = report.items[0];
        if (!planned || planned.action !== "would_settle") {
          out.replaceChildren(el("p", { id: "evidence-skipped", class: "status-bad" },
            "Cannot settle from evidence: " + reason(planned)));
          dry.disabled = false;
          return;
        }
        const confirm = el("button", { type: "button", class: "danger", id: "confirm-evidence" },
          "Charge " + planned.amount + " " + item.currency);
        confirm.addEventListener("click", async () => {
          confirm.disabled = true;
          showError("");
          try {
            const done = await postJson("/v1/admin/reconcile/resolve-from-evidence", { keys: [item.operation_key] });
            const settled = done.items[0];
            if (!settled || settled.action !== "settled") {
              out.replaceChildren(el("p", { id: "evidence-skipped", class: "status-bad" },
                "Not settled: " + reason(settled)));
              return;
            }
            out.replaceChildren(el("p", { id: "resolved", class: "status-ok", "data-amount": settled.amount },
              "Settled from evidence " + text(settled.evidence_id) + ": charged " + settled.amount + " " + item.currency +
              (settled.amount === planned.amount ? "" : " (the dry run showed " + planned.amount + ")")));
            const row = document.querySelector("tr[data-operation-key=\"" + CSS.escape(item.operation_key) + "\"]");
            if (row) row.remove();
            dry.remove();
          } catch (error) {
            showError(error.message);
          }
        });
        out.replaceChildren(el("div", { class: "quote", id: "evidence-quote", "data-amount": planned.amount },
          el("p", {}, "Settling from the stored evidence (", usageText(planned.usage), ") will charge ",
            el("strong", { id: "evidence-amount" }, planned.amount + " " + item.currency),
            " and release the hold of " + item.hold + " " + item.currency + ". Nothing has changed yet."),
          confirm));
      } catch (error) {
        showError(error.message);
        dry.disabled = false;
      }
    });
    container.replaceChildren(el("h2", {}, "Resolve " + item.operation_key + " from evidence"),
      el("p", {}, "Evidence: " + item.evidence + " (" + usageText(item.exact_usage) + ")"), dry, out);
  }

  let fetchNotice = "";

  async function fetchEvidence() {
    showError("");
    try {
      const r = await postJson("/v1/admin/reconcile/fetch-evidence", {});
      fetchNotice = "Fetched: " + r.scanned + " looked at, " + r.stored + " stored, " + r.duplicate + " already stored" +
        (r.skipped.length ? "; skipped " + r.skipped.map((k) => k.operation_key + " (" + k.reason + ")").join(", ") : "") + ".";
      await render();
    } catch (error) {
      showError(error.message);
    }
  }

  function evidenceText(item) {
    const ev = item.latest_evidence;
    const parts = [item.evidence];
    if (item.exact_amount) parts.push("would charge " + item.exact_amount + " " + item.currency);
    if (ev) parts.push(item.evidence_rows + " rows, latest " + ev.source + (ev.exact ? " exact" : "") + (ev.acknowledged ? ", acknowledged" : ""));
    return parts.join(" · ");
  }

  async function backlog() {
    const b = await getJson("/v1/console/backlog");
    const panel = el("section", { class: "card", id: "resolve-panel", hidden: true });
    const rows = b.items.map((item) => {
      const settleable = item.exact_amount !== null && item.exact_amount !== undefined;
      let button;
      if (settleable) {
        button = el("button", { type: "button", class: "resolve-evidence", "data-execution": item.execution_id }, "Resolve from evidence…");
        button.addEventListener("click", () => { panel.hidden = false; evidenceForm(item, panel); });
      } else {
        button = el("button", { type: "button", class: "resolve", "data-execution": item.execution_id }, "Resolve with stated usage…");
        button.addEventListener("click", () => { panel.hidden = false; resolveForm(item, panel); });
      }
      return el("tr", { "data-operation-key": item.operation_key, "data-evidence": item.evidence },
        el("td", {}, el("a", { href: "#execution/" + encodeURIComponent(item.operation_key) }, item.operation_key)),
        el("td", {}, item.consumer + " / " + item.model),
        el("td", {}, text(item.reconciliation_reason)),
        el("td", { class: "num" }, age(item.age_secs)),
        el("td", { class: "num hold" }, item.hold + " " + item.currency),
        el("td", {}, text(item.provider_ref)),
        el("td", { class: "evidence evidence-" + item.evidence }, evidenceText(item)),
        el("td", {}, button));
    });
    const fetchButton = el("button", { type: "button", id: "fetch-evidence" }, "Fetch evidence");
    fetchButton.addEventListener("click", () => { fetchButton.disabled = true; fetchEvidence(); });
    const notice = fetchNotice;
    fetchNotice = "";
    return el("div", { id: "backlog" },
      el("h2", {}, "Backlog: executions awaiting an operator"),
      el("p", {}, fetchButton, " ", el("span", { id: "fetch-report", class: "hint" }, notice ||
        "Asks the providers that keep finished responses for their usage; stores it as evidence, never settles.")),
      b.items.length ? table(["operation key", "consumer / model", "reason", { label: "age", num: true },
        { label: "held", num: true }, "provider ref", "evidence", ""], rows, { id: "backlog-table" })
        : el("p", { id: "backlog-empty" }, "Nothing awaits an operator."),
      b.truncated ? el("p", { class: "hint" }, "More items await; the oldest are shown.") : null,
      panel);
  }

  function age(secs) {
    if (secs < 120) return secs + " s";
    if (secs < 7200) return Math.floor(secs / 60) + " min";
    return Math.floor(secs / 3600) + " h";
  }

  // ---- execution ---------------------------------------------------------------------------
  async function execution(key) {
    const input = el("input", { id: "operation-key", value: key, placeholder: "operation key", size: "40" });
    const form = el("form", { class: "inline", id: "execution-form" }, el("label", {}, "operation key", input),
      el("button", { type: "submit" }, "Open"));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      location.hash = "#execution/" + encodeURIComponent(input.value.trim());
    });
    const page = el("div", { id: "execution" }, el("h2", {}, "Execution"), form);
    if (!key) return page;
    const x = await getJson("/v1/console/executions/" + encodeURIComponent(key));
    const j = x.journal;
    page.append(
      card("Journal row", kv([
        ["execution id", el("code", {}, j.execution_id)], ["operation key", j.operation_key], ["kind", j.kind],
        ["root", text(j.root_key)], ["state", el("span", { id: "journal-state" }, j.state)], ["outcome", text(j.outcome)],
        ["not dispatched cause", text(j.not_dispatched_cause)], ["reconciliation reason", text(j.reconciliation_reason)],
        ["consumer / session", j.consumer + " / " + j.session_id], ["accounting day", j.accounting_day],
        ["provider / model", j.provider + " / " + j.model], ["price / policy version", j.price_version + " / " + j.policy_version],
        ["hold", j.hold + " " + j.currency], ["provider ref", text(j.provider_ref)], ["fence", j.fence],
        ["binding digest", el("code", {}, j.binding_digest)], ["claimed", j.created_at], ["updated", j.updated_at],
      ])),
      card("Settlement", x.settlement ? kv([
        ["amount", el("span", { id: "settlement-amount" }, x.settlement.amount + " " + x.settlement.currency)],
        ["source", x.settlement.source], ["usage", usageText(x.settlement.usage)],
        ["price version", x.settlement.price_version], ["settled at", x.settlement.settled_at],
      ]) : el("p", {}, "Not settled.")),
      card("Usage evidence", x.evidence.length ? table(["seq", "source", "usage", "exact", "provider ref", "received", "acknowledged"],
        x.evidence.map((e) => el("tr", {}, el("td", {}, e.seq), el("td", {}, e.source), el("td", {}, usageText(e.usage)),
          el("td", {}, e.exact ? "yes" : "no"), el("td", {}, text(e.provider_ref)), el("td", {}, e.received_at),
          el("td", {}, text(e.acknowledged_at))))) : el("p", {}, "No evidence.")),
      card("Audit trail", table(["seq", "kind", "at", "detail"], x.audit.map((a) => el("tr", {},
        el("td", {}, a.seq), el("td", {}, a.kind), el("td", {}, a.at), el("td", {}, el("code", {}, JSON.stringify(a.detail))))),
        { id: "audit-trail" }),
        x.audit_partial ? el("p", { class: "hint" }, "Only the newest audit rows of the scope were searched.") : null));
    return page;
  }

  function usageText(u) {
    if (!u) return "none";
    return CLASSES.filter((c) => u[c]).map((c) => c + " " + u[c]).join(", ") || "none";
  }

  // ---- finance -----------------------------------------------------------------------------
  let financeState = { from: "", to: "", page: 1 };

  function financeQuery(extra) {
    const q = new URLSearchParams();
    if (financeState.from) q.set("from", financeState.from);
    if (financeState.to) q.set("to", financeState.to);
    for (const [k, v] of Object.entries(extra || {})) q.set(k, String(v));
    return q.toString();
  }

  async function download() {
    showError("");
    try {
      const response = await api("GET", "/v1/console/finance/settlements.csv?" + financeQuery());
      const disposition = response.headers.get("Content-Disposition") || "";
      const match = /filename="([^"]+)"/.exec(disposition);
      const blob = await response.blob();
      const url = URL.createObjectURL(blob);
      const link = el("a", { href: url, download: match ? match[1] : "settlements.csv", hidden: true });
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
      $("csv-status").textContent = "Downloaded " + (match ? match[1] : "settlements.csv") + ".";
    } catch (error) {
      showError(error.message);
    }
  }

  async function finance() {
    const f = await getJson("/v1/console/finance?" + financeQuery({ page: financeState.page }));
    const from = el("input", { type: "date", id: "finance-from", value: f.from });
    const to = el("input", { type: "date", id: "finance-to", value: f.to });
    const form = el("form", { class: "inline", id: "finance-form" }, el("label", {}, "from", from), el("label", {}, "to", to),
      el("button", { type: "submit" }, "Show"));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      financeState = { from: from.value, to: to.value, page: 1 };
      render();
    });
    const csv = el("button", { type: "button", id: "download-csv" }, "Download CSV of this range");
    csv.addEventListener("click", download);
    const pages = Math.max(1, Math.ceil(f.rows_total / f.page_size));
    const prev = el("button", { type: "button", id: "page-prev", disabled: f.page <= 1 }, "Previous");
    const next = el("button", { type: "button", id: "page-next", disabled: f.page >= pages }, "Next");
    prev.addEventListener("click", () => { financeState.page = f.page - 1; render(); });
    next.addEventListener("click", () => { financeState.page = f.page + 1; render(); });
    const rows = f.rows.map((r) => el("tr", {}, el("td", {}, r.day), el("td", {}, r.consumer), el("td", {}, r.model),
      el("td", { class: "num" }, r.settlements), el("td", { class: "num amount" }, r.amount), el("td", {}, r.currency)));
    const prices = f.prices.map((p) => el("tr", {}, el("td", {}, p.price_version), el("td", {}, p.model), el("td", {}, p.currency),
      el("td", { class: "num" }, p.prices.input), el("td", { class: "num" }, p.prices.output),
      el("td", { class: "num" }, p.prices.cache_read), el("td", { class: "num" }, p.prices.cache_write),
      el("td", { class: "num" }, p.prices.reasoning), el("td", {}, p.profiles.join(", "))));
    return el("div", { id: "finance" },
      el("h2", {}, "Finance · settlements " + f.from + " to " + f.to),
      form, el("p", {}, csv, " ", el("span", { id: "csv-status", class: "hint" })),
      card("Settled per day", f.charts.length ? f.charts.map((c) =>
        el("div", { "data-currency": c.currency }, el("p", {}, "Total " + c.total + " " + c.currency + " over " + f.settlements + " settlements"), svg(c.svg)))
        : el("p", { id: "finance-empty" }, "No settlements in this range.")),
      card("By day, consumer and model",
        table(["day", "consumer", "model", { label: "settlements", num: true }, { label: "amount", num: true }, "currency"], rows, { id: "finance-table" }),
        el("div", { class: "pager" }, prev, el("span", { id: "page-info" }, "page " + f.page + " of " + pages + " (" + f.rows_total + " rows)"), next)),
      card("Price versions in force (per million tokens)",
        table(["version", "model", "currency", { label: "input", num: true }, { label: "output", num: true },
          { label: "cache read", num: true }, { label: "cache write", num: true }, { label: "reasoning", num: true }, "profiles"], prices)));
  }

  // ---- audit -------------------------------------------------------------------------------
  async function audit() {
    const a = await getJson("/v1/console/audit");
    const chain = a.chain;
    const ledger = a.ledger;
    const first = ledger.violations[0];
    return el("div", { id: "audit" },
      el("h2", {}, "Audit · " + a.scope),
      card("Audit chain",
        el("p", { id: "chain-status", class: chain.ok ? "status-ok" : "status-bad" },
          chain.ok ? "verified: " + chain.rows_verified + " rows, every chain ends at its head (" + chain.head_seq + " rows)"
            : "chain " + chain.first_violation.chain + " broken at seq " + chain.first_violation.seq + ": " + chain.first_violation.reason),
        checkedHint(chain, "chain-checked")),
      card("Ledger audit",
        el("p", { id: "ledger-audit-status", class: ledger.ok ? "status-ok" : "status-bad" },
          ledger.ok ? "clean" : ledger.violations_total + " violations"),
        kv(Object.entries(ledger.checked).map(([k, v]) => [k.replaceAll("_", " "), v])),
        first ? el("p", {}, "First violation: ", el("code", { id: "first-violation" }, JSON.stringify(first))) : null,
        checkedHint(ledger, "ledger-audit-checked")));
  }

  // ---- keys --------------------------------------------------------------------------------
  // Metadata of the scope's keys (GET /v1/admin/keys: ids are digests, never a key) and their
  // revocation after a confirmation (POST /v1/admin/keys/{id}/revoke).
  async function keys() {
    const k = await getJson("/v1/admin/keys");
    const status = el("div", { id: "revoke-area" });
    const rows = k.keys.map((key) => {
      const short = key.id.slice(0, 12);
      let action = el("span", { class: "hint" }, key.revocable ? "revoked" : "configured (not revocable)");
      if (!key.revoked && key.revocable) {
        action = el("button", { type: "button", class: "revoke", "data-key-id": key.id }, "Revoke…");
        action.addEventListener("click", () => {
          showError("");
          const confirm = el("button", { type: "button", class: "danger", id: "confirm-revoke" }, "Revoke " + short + "…");
          const cancel = el("button", { type: "button", id: "cancel-revoke" }, "Cancel");
          cancel.addEventListener("click", () => status.replaceChildren());
          confirm.addEventListener("click", async () => {
            confirm.disabled = true;
            try {
              await postJson("/v1/admin/keys/" + encodeURIComponent(key.id) + "/revoke");
              await render();
            } catch (error) {
              showError(error.message);
              confirm.disabled = false;
            }
          });
          status.replaceChildren(el("div", { class: "quote", id: "revoke-confirm", "data-key-id": key.id },
            el("p", {}, "Revoke the " + key.role + " key " + short + "…? It stops working on its next request; this cannot be undone."),
            confirm, " ", cancel));
        });
      }
      return el("tr", { "data-key-id": key.id, "data-revoked": String(key.revoked) },
        el("td", {}, el("code", {}, short + "…")), el("td", {}, key.role), el("td", {}, text(key.created_at)),
        el("td", {}, text(key.last_used_at)), el("td", {}, text(key.expires_at)),
        el("td", { class: "revoked" }, key.revoked ? "revoked " + text(key.revoked_at) : "active"), el("td", {}, action));
    });
    return el("div", { id: "keys" },
      el("h2", {}, "Keys · " + session.scope),
      card("API keys of this scope (ids only; a key is never shown)",
        table(["id", "role", "created", "last used", "expires", "state", ""], rows, { id: "keys-table" }), status));
  }

  // ---- session -----------------------------------------------------------------------------
  async function open() {
    showError("");
    if (!sessionStorage.getItem(KEY)) {
      $("login").hidden = false;
      return;
    }
    try {
      session = await getJson("/v1/console/session");
      $("login").hidden = true;
      if (!session.pages.includes(route().page)) location.hash = "#" + session.pages[0];
      await render();
    } catch (error) {
      session = null;
      sessionStorage.removeItem(KEY);
      $("login").hidden = false;
      $("view").replaceChildren();
      showError(error.status === 403 ? "This key may not open the console (" + error.message + ")." : error.message);
    }
  }

  function start() {
    // Counted so that a test (or a person with the inspector open) sees any blocked load.
    let violations = 0;
    document.addEventListener("securitypolicyviolation", () => {
      violations += 1;
      document.body.setAttribute("data-csp-violations", String(violations));
    });
    $("key-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const key = $("key").value.trim();
      $("key").value = "";
      if (key) sessionStorage.setItem(KEY, key);
      open();
    });
    $("forget").addEventListener("click", () => {
      sessionStorage.removeItem(KEY);
      session = null;
      $("nav").replaceChildren();
      $("who").textContent = "";
      $("forget").hidden = true;
      $("view").replaceChildren();
      open();
    });
    window.addEventListener("hashchange", () => { if (session) render(); });
    open();
  }

  // The chart path, reachable from outside this closure so that the browser test can hand it a
  // hostile SVG (the server draws none) and read what it keeps; it reads and sends nothing.
  window.tollgateConsole = Object.freeze({ chart: svg });

  start();
})();

// ppfs console: a client of the gateway's REST API. No dependencies, no build step.
// The bearer token lives in sessionStorage and travels only in the Authorization header.
// Every piece of text from the API is inserted with textContent, never as HTML, and with
// its control, bidi-formatting and separator characters written as escapes (shown()).
"use strict";

(() => {
  const TOKEN_KEY = "ppfs.token";
  const FINAL = new Set(["succeeded", "failed", "cancelled"]);
  let who = null;
  let live = null; // AbortController of the current view's streams and timers

  // ---------------------------------------------------------------- helpers
  const $ = (id) => document.getElementById(id);

  // Control, format (bidi overrides, zero-width), surrogate, private-use, unassigned, line
  // and paragraph separator characters, as the CLI escapes them (ppfs_client.terminal):
  // the gateway refuses them in names, but a party's phase and error are relayed as it
  // wrote them, and one could reorder or hide what the console writes next to them.
  const HIDDEN = /[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}]/gu;
  const hex = (n, width) => n.toString(16).padStart(width, "0");
  const escaped = (ch) => {
    if (ch === "\n" || ch === "\t") return ch;
    const n = ch.codePointAt(0);
    return n < 0x100 ? `\\x${hex(n, 2)}` : n < 0x10000 ? `\\u${hex(n, 4)}` : `\\U${hex(n, 8)}`;
  };
  const shown = (text) => String(text).replace(HIDDEN, escaped);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = shown(v);
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      node.append(c instanceof Node ? c : document.createTextNode(shown(c)));
    }
    return node;
  }

  const shortId = (id) => (id && id.length > 12 ? id.slice(0, 8) + "…" : id || "");
  const fmtBytes = (n) => {
    if (!n) return "—";
    const u = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    let v = n;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i += 1; }
    return `${v < 10 && i ? v.toFixed(1) : Math.round(v)} ${u[i]}`;
  };
  const fmtSeconds = (s) => {
    if (s === null || s === undefined || Number.isNaN(s)) return "—";
    if (s < 1) return `${Math.round(s * 1000)} ms`;
    if (s < 120) return `${s.toFixed(1)} s`;
    const m = Math.floor(s / 60);
    return m < 120 ? `${m} min ${Math.round(s % 60)} s` : `${Math.floor(m / 60)} h ${m % 60} min`;
  };
  const fmtTime = (iso) => {
    if (!iso) return "—";
    const d = new Date(iso);
    return Number.isNaN(d.getTime()) ? iso : d.toLocaleString();
  };
  const elapsed = (job) => {
    const end = FINAL.has(job.state) ? Date.parse(job.updated_at) : Date.now();
    return (end - Date.parse(job.created_at)) / 1000;
  };
  const fingerprint = (hex) => (hex ? hex.slice(0, 32).match(/.{4}/g).join(" ") : "—");
  const badge = (state) => el("span", { class: `badge badge-${state}`, text: state });

  // ---------------------------------------------------------------- API
  class Unauthorized extends Error {}

  function token() { return sessionStorage.getItem(TOKEN_KEY); }

  async function api(path, opts = {}) {
    const resp = await fetch(`../${path}`, {
      ...opts,
      cache: "no-store",
      credentials: "omit",
      headers: { Accept: "application/json", Authorization: `Bearer ${token()}`,
        ...(opts.headers || {}) },
    });
    if (resp.status === 401) throw new Unauthorized("the token is not valid here");
    const type = resp.headers.get("content-type") || "";
    const body = type.includes("json") ? await resp.json() : null;
    if (!resp.ok) {
      const detail = body && (body.detail || body.title);
      throw new Error(detail || `${resp.status} ${resp.statusText}`);
    }
    return body;
  }

  // Server-sent events over fetch(): EventSource cannot send an Authorization header.
  async function followJob(id, onJob, signal) {
    const resp = await fetch(`../v1/jobs/${encodeURIComponent(id)}/events`, {
      headers: { Accept: "text/event-stream", Authorization: `Bearer ${token()}` },
      cache: "no-store", credentials: "omit", signal,
    });
    if (resp.status === 401) throw new Unauthorized("the token is not valid here");
    if (!resp.ok || !resp.body) throw new Error(`event stream: ${resp.status}`);
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += value.replace(/\r\n/g, "\n");
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        let event = "message";
        const data = [];
        for (const line of block.split("\n")) {
          if (line.startsWith(":")) continue;
          if (line.startsWith("event:")) event = line.slice(6).trim();
          else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
        }
        if (event === "job" && data.length) onJob(JSON.parse(data.join("\n")));
        if (event === "end") { reader.cancel().catch(() => {}); return; }
      }
    }
  }

  // ---------------------------------------------------------------- shell
  function showSignin(message) {
    who = null;
    $("signin").hidden = false;
    $("nav").hidden = true;
    $("who").hidden = true;
    $("view").replaceChildren();
    const err = $("signin-error");
    err.hidden = !message;
    err.textContent = message || "";
    $("token").focus();
  }

  async function signIn(value) {
    sessionStorage.setItem(TOKEN_KEY, value);
    try {
      who = await api("v1/principal");
    } catch (e) {
      sessionStorage.removeItem(TOKEN_KEY);
      showSignin(e instanceof Unauthorized ? "This token is not valid here." : e.message);
      return;
    }
    $("signin").hidden = true;
    $("nav").hidden = false;
    $("who").hidden = false;
    $("who-role").textContent = who.role.replace("_", " ");
    $("who-subject").textContent = who.subject;
    route();
  }

  function signOut() {
    sessionStorage.removeItem(TOKEN_KEY);
    if (live) live.abort();
    showSignin("");
  }

  function page(title, subtitle, ...body) {
    const head = el("div", { class: "page-head" },
      el("div", {}, el("h1", { text: title }), subtitle ? el("p", { class: "muted", text: subtitle }) : null));
    $("view").replaceChildren(head, ...body);
    return head;
  }

  function failed(e) {
    if (e instanceof Unauthorized) { signOut(); showSignin("The session ended: sign in again."); return; }
    if (e && e.name === "AbortError") return;
    $("view").replaceChildren(el("div", { class: "card error-card" },
      el("strong", { text: "Could not load this page. " }), e.message));
  }

  async function route() {
    if (!who) return;
    if (live) live.abort();
    live = new AbortController();
    const parts = (location.hash.replace(/^#\/?/, "") || "overview").split("/");
    for (const a of document.querySelectorAll("#nav a")) {
      a.classList.toggle("active", a.dataset.route === parts[0]);
    }
    const signal = live.signal;
    try {
      if (parts[0] === "datasets" && parts[1]) await datasetPage(decodeURIComponent(parts[1]));
      else if (parts[0] === "datasets") await datasetsPage();
      else if (parts[0] === "jobs" && parts[1]) await jobPage(decodeURIComponent(parts[1]), signal);
      else if (parts[0] === "jobs") await jobsPage(signal);
      else await overviewPage(signal);
    } catch (e) { failed(e); }
  }

  function every(seconds, signal, fn) {
    const t = setInterval(() => fn().catch(failed), seconds * 1000);
    signal.addEventListener("abort", () => clearInterval(t));
  }

  // ---------------------------------------------------------------- overview
  async function overviewPage(signal) {
    const [status, jobs, datasets] = await Promise.all([
      api("v1/deployment/status"), api("v1/jobs"), api("v1/datasets")]);
    const counts = {};
    for (const j of jobs) counts[j.state] = (counts[j.state] || 0) + 1;
    const reachable = status.parties.filter((p) => p.reachable).length;
    const tiles = el("div", { class: "tiles" },
      tile("Deployment", status.healthy ? "Healthy" : "Degraded",
        `${reachable} of ${status.parties.length} parties reachable`, status.healthy ? "ok" : "bad"),
      tile("Sharing", status.scheme.toUpperCase(), status.securities.join(", ")),
      tile("Data sets", String(datasets.length), "visible to you"),
      tile("Jobs", String(jobs.length),
        ["running", "queued", "succeeded", "failed"].filter((s) => counts[s])
          .map((s) => `${counts[s]} ${s}`).join(" · ") || "none yet"),
    );
    const cards = el("div", { class: "party-grid", id: "parties" }, status.parties.map(partyCard));
    const gatewayWarnings = el("div", { id: "gateway-warnings" },
      (status.warnings || []).map((w) => el("p", { class: "warning", text: w })));
    page("Overview", `Gateway ${status.gateway_version}. Parties are probed live.`, tiles,
      gatewayWarnings, el("h2", { text: "Computing parties" }), cards);
    every(10, signal, async () => {
      const s = await api("v1/deployment/status");
      const grid = $("parties");
      if (grid) grid.replaceChildren(...s.parties.map(partyCard));
    });
  }

  function tile(label, value, note, tone) {
    return el("div", { class: `tile${tone ? ` tile-${tone}` : ""}` },
      el("div", { class: "tile-label", text: label }),
      el("div", { class: "tile-value", text: value }),
      el("div", { class: "tile-note", text: note }));
  }

  function partyCard(p) {
    const fp = p.fingerprints;
    const rows = [
      ["Version", p.software_version || "—"],
      ["Engines", p.engines.length
        ? p.engines.map((e) => (p.engine_versions[e] ? `${e} ${p.engine_versions[e]}` : e)).join(", ")
        : "—"],
      ["MPC address", p.mpc_address || "—"],
      ["Latency", p.latency_ms === null ? "—" : `${p.latency_ms} ms`],
      ["Certificates until", p.certificates_end ? p.certificates_end.slice(0, 10) : "—"],
    ];
    const fps = fp ? [
      ["Box key", fp.box_public_key],
      ["Signing key", fp.signing_public_key],
      ["TLS certificate", fp.tls_certificate],
    ] : [];
    return el("article", { class: "card party", "data-party": p.name },
      el("div", { class: "party-head" },
        el("span", { class: `dot ${p.reachable && !p.problem ? "dot-ok" : "dot-bad"}` }),
        el("h3", { text: p.name }),
        el("span", { class: "party-index muted", text: `party ${p.index}` }),
        el("span", { class: `status ${p.reachable ? "status-ok" : "status-bad"}`,
          text: p.reachable ? (p.problem || "Reachable") : "Unreachable" })),
      p.reachable ? null : el("p", { class: "error", text: p.problem }),
      (p.warnings || []).map((w) => el("p", { class: "warning", text: w })),
      el("dl", { class: "kv" }, rows.map(([k, v]) => [el("dt", { text: k }), el("dd", { text: v })])),
      fps.length ? el("div", { class: "fps" },
        el("div", { class: "fps-title muted", text: "SHA-256 fingerprints, as the party reports them" }),
        el("dl", { class: "kv mono" }, fps.map(([k, v]) => [
          el("dt", { text: k }), el("dd", { title: v, text: fingerprint(v) })]))) : null);
  }

  // ---------------------------------------------------------------- data sets
  async function datasetsPage() {
    const list = await api("v1/datasets");
    const table = el("table", { class: "table", id: "datasets" },
      el("thead", {}, el("tr", {}, ["Name", "Owner", "Rows (m)", "Columns (p)", "Label",
        "Classes", "Uploads", "Created"].map((h) => el("th", { text: h })))),
      el("tbody", {}, list.map((d) => el("tr", { class: "clickable", "data-id": d.id,
        onclick: () => { location.hash = `#/datasets/${encodeURIComponent(d.id)}`; } },
      el("td", {}, el("a", { href: `#/datasets/${encodeURIComponent(d.id)}`, text: d.name }),
        el("div", { class: "muted mono small", text: shortId(d.id) })),
      el("td", { text: d.owner_id }),
      el("td", { class: "num", text: d.rows }),
      el("td", { class: "num", text: d.p }),
      el("td", { text: d.label_column || "—" }),
      el("td", { text: d.classes.length ? d.classes.join(", ") : "—" }),
      el("td", { class: "num", text: d.upload_ids.length }),
      el("td", { text: fmtTime(d.created_at) })))));
    page("Data sets", "Public schemas of the data sets you own or were granted. Values stay with the parties.",
      list.length ? el("div", { class: "card flush" }, table)
        : el("div", { class: "card empty", text: "No data set is visible to you yet." }));
  }

  async function datasetPage(id) {
    const d = await api(`v1/datasets/${encodeURIComponent(id)}`);
    const meta = el("dl", { class: "kv kv-wide" },
      [["Data set id", d.id], ["Owner", d.owner_id], ["Rows (m)", d.rows], ["Columns (p)", d.p],
        ["Label column", d.label_column || "—"], ["Classes", d.classes.join(", ") || "—"],
        ["Fractional bits", d.frac_bits ?? "—"], ["Uploads", d.upload_ids.length],
        ["Created", fmtTime(d.created_at)]]
        .map(([k, v]) => [el("dt", { text: k }), el("dd", { text: v })]));
    const cols = el("table", { class: "table", id: "schema" },
      el("thead", {}, el("tr", {}, ["#", "Column", "Scale exponent", "Role"].map((h) => el("th", { text: h })))),
      el("tbody", {}, d.columns.map((c, i) => el("tr", {},
        el("td", { class: "num muted", text: i + 1 }),
        el("td", { class: "mono", text: c }),
        el("td", { class: "num" }, d.column_exponents[i] !== undefined
          ? ["2", el("sup", { text: d.column_exponents[i] })] : "—"),
        el("td", {}, c === d.label_column ? el("span", { class: "tag", text: "label" }) : "feature")))));
    page(d.name, "Public schema", el("p", {}, el("a", { href: "#/datasets", text: "← All data sets" })),
      el("div", { class: "two-col" },
        el("div", { class: "card" }, el("h2", { text: "Summary" }), meta),
        el("div", { class: "card flush" }, el("h2", { class: "pad", text: "Columns" }), cols)));
  }

  // ---------------------------------------------------------------- jobs
  async function jobsPage(signal) {
    const render = (jobs) => {
      const rows = jobs.slice().reverse().map((j) => el("tr", { class: "clickable", "data-id": j.id,
        onclick: () => { location.hash = `#/jobs/${encodeURIComponent(j.id)}`; } },
      el("td", {}, el("a", { class: "mono", href: `#/jobs/${encodeURIComponent(j.id)}`, text: shortId(j.id) })),
      el("td", {}, badge(j.state)),
      el("td", { text: j.submitter }),
      el("td", { text: `${j.engine} · ${j.security}` }),
      el("td", { class: "num", text: `${j.k} of ${j.p}` }),
      el("td", { class: "num", text: j.m }),
      el("td", { text: fmtTime(j.created_at) }),
      el("td", { class: "num", text: fmtSeconds(elapsed(j)) })));
      return el("table", { class: "table", id: "jobs" },
        el("thead", {}, el("tr", {}, ["Job", "State", "Submitter", "Engine · security", "k of p",
          "Rows", "Submitted", "Duration"].map((h) => el("th", { text: h })))),
        el("tbody", {}, rows));
    };
    const box = el("div", { class: "card flush", id: "jobs-box" });
    const fill = (jobs) => box.replaceChildren(jobs.length ? render(jobs)
      : el("div", { class: "empty", text: "No job yet. Submit one with `ppfs jobs submit` or the SDK." }));
    fill(await api("v1/jobs"));
    page("Jobs", who.role === "admin" ? "Every job of the deployment." : "Your jobs.", box);
    every(3, signal, async () => fill(await api("v1/jobs")));
  }

  async function jobPage(id, signal) {
    let job = await api(`v1/jobs/${encodeURIComponent(id)}`);
    const view = el("div", { id: "job", "data-id": job.id });
    page(`Job ${shortId(job.id)}`, null, el("p", {}, el("a", { href: "#/jobs", text: "← All jobs" })), view);
    const draw = () => view.replaceChildren(...jobView(job));
    draw();
    every(1, signal, async () => { if (!FINAL.has(job.state)) draw(); });
    if (!FINAL.has(job.state)) {
      try {
        await followJob(job.id, (j) => { job = j; draw(); }, signal);
      } catch (e) {
        if (e.name !== "AbortError") throw e;
      }
      if (!signal.aborted) { job = await api(`v1/jobs/${encodeURIComponent(id)}`); draw(); }
    }
  }

  function jobView(job) {
    const final = FINAL.has(job.state);
    const head = el("div", { class: "job-head card" },
      el("div", { class: "job-title" }, badge(job.state),
        el("span", { class: "mono job-id", text: job.id }),
        job.failure_kind ? el("span", { class: "tag tag-bad", text: `failure: ${job.failure_kind}` }) : null),
      el("div", { class: "job-actions" },
        !final && who && job.submitter === who.subject
          ? el("button", { type: "button", class: "btn btn-danger", id: "cancel",
            onclick: (ev) => cancelJob(job.id, ev.currentTarget) }, "Cancel job") : null),
      job.error ? el("p", { class: "error", text: job.error }) : null);
    const steps = job.training ? "Step 2A + 2B (selection and training)" : "Step 2A (selection)";
    const meta = el("dl", { class: "kv kv-wide" },
      [["Submitted by", job.submitter], ["Computation", steps],
        ["Engine", job.engine], ["Security", job.security],
        ["Data sets", job.dataset_ids.map(shortId).join(", ")], ["Combination", job.combination],
        ["Shape", `m = ${job.m} rows, p = ${job.p} columns, ${job.classes.length} classes`],
        ["Select", `k = ${job.k} (label ${job.label_column})`],
        ["Submitted", fmtTime(job.created_at)], ["Last change", fmtTime(job.updated_at)],
        ["Elapsed", fmtSeconds(elapsed(job))],
        ["Bytes sent", fmtBytes(job.parties.reduce((a, p) => a + p.bytes_sent, 0))],
        ["Description SHA-256", job.description_sha256.slice(0, 16) + "…"]]
        .map(([k, v]) => [el("dt", { text: k }), el("dd", { text: v })]));
    const parties = el("div", { class: "card" }, el("h2", { text: "Parties" }),
      el("div", { class: "bars" }, job.parties.map(partyBar)));
    const result = el("div", { class: "card result" }, el("h2", { text: "Result" }),
      job.state === "succeeded"
        ? [el("p", { text: "The result is sealed to the submitter's key; this console never opens it. "
            + "Fetch and open it where that key is:" }),
        el("div", { class: "cmd" }, el("code", { id: "fetch-cmd", text: `ppfs result fetch ${job.id}` }),
          el("button", { type: "button", class: "btn btn-quiet", onclick: (ev) => copy(`ppfs result fetch ${job.id}`, ev.currentTarget) }, "Copy"))]
        : el("p", { class: "muted", text: final ? "This job has no result." : "The result can be fetched once every party succeeded." }));
    return [head, el("div", { class: "two-col" }, parties,
      el("div", { class: "card" }, el("h2", { text: "Details" }), meta)), result];
  }

  function partyBar(p) {
    const pct = Math.round((p.state === "succeeded" ? 1 : p.progress) * 100);
    const fill = el("div", { class: `bar-fill bar-${p.state}` });
    fill.style.width = `${pct}%`; // CSSOM, allowed by the CSP (no inline style attribute)
    return el("div", { class: "bar-row", "data-party": p.name, "data-state": p.state },
      el("div", { class: "bar-label" },
        el("strong", { text: p.name }), badge(p.state),
        el("span", { class: "muted bar-phase", text: p.phase || "" }),
        el("span", { class: "bar-pct", text: `${pct}%` })),
      el("div", { class: "bar", role: "progressbar", "aria-valuemin": 0, "aria-valuemax": 100,
        "aria-valuenow": pct, "aria-label": `${p.name} progress` }, fill),
      el("div", { class: "bar-meta muted small" },
        `engine ${fmtSeconds(p.seconds || null)} · sent ${fmtBytes(p.bytes_sent)}`
        + (p.program_sha256 ? ` · program ${p.program_sha256.slice(0, 12)}` : "")
        + (p.failure_kind ? ` · failure ${p.failure_kind}` : "")),
      p.error ? el("div", { class: "error small", text: p.error }) : null);
  }

  async function cancelJob(id, button) {
    button.disabled = true;
    button.textContent = "Cancelling…";
    try {
      await api(`v1/jobs/${encodeURIComponent(id)}/cancel`, { method: "POST" });
    } catch (e) {
      button.disabled = false;
      button.textContent = "Cancel job";
      failed(e);
    }
  }

  function copy(text, button) {
    if (!navigator.clipboard) return;
    navigator.clipboard.writeText(text).then(() => {
      button.textContent = "Copied";
      setTimeout(() => { button.textContent = "Copy"; }, 1500);
    }).catch(() => {});
  }

  // ---------------------------------------------------------------- start
  document.addEventListener("DOMContentLoaded", () => {
    $("signin-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const value = $("token").value.trim();
      $("token").value = "";
      if (value) signIn(value);
    });
    $("sign-out").addEventListener("click", signOut);
    window.addEventListener("hashchange", route);
    const saved = token();
    if (saved) signIn(saved); else showSignin("");
  });
})();

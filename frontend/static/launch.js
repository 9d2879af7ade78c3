// The launch form posts to the REST API (as the CLI does) and puts each error beside its field.
(function () {
  "use strict";
  const { $, api } = window.PEARL;
  const form = $("launch");

  function clearErrors() {
    for (const e of form.querySelectorAll(".field-error")) e.textContent = "";
    for (const f of form.querySelectorAll(".field")) f.classList.remove("invalid");
    $("form-error").textContent = "";
  }

  function showError(field, message) {
    const slot = field && $("err_" + field);
    if (slot) { slot.textContent = message; slot.closest(".field").classList.add("invalid"); }
    else $("form-error").textContent = message;
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault(); clearErrors();
    const body = {};
    for (const input of form.querySelectorAll("input, select")) {
      if (input.value === "") continue; // the API applies its defaults and names the missing required fields
      if (input.dataset.json) {
        try { body[input.name] = JSON.parse(input.value); } catch (e) { showError(input.name, "not valid JSON: " + e.message); return; }
      } else body[input.name] = input.type === "number" ? Number(input.value) : input.value;
    }
    const button = form.querySelector("button[type=submit]"); button.disabled = true;
    const res = await api("POST", "/api/jobs/", body);
    button.disabled = false;
    if (res.ok) { location.assign(`/jobs/${res.data.id}/`); return; }
    const errs = res.data.errors;
    if (errs && typeof errs === "object" && !Array.isArray(errs)) {
      for (const [field, msgs] of Object.entries(errs)) showError(field === "non_field_errors" ? null : field, [].concat(msgs).join(" "));
    } else showError(res.data.field, res.data.detail || `error ${res.status}`);
  });
})();

// ringzero ui: the process table follows the store (server-sent events from /events), and
// every action asks for a confirmation first. Nothing else runs in the page.
"use strict";

document.addEventListener("submit", (event) => {
  const question = event.target.dataset.confirm;
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});

const table = document.getElementById("table");
if (table) {
  const events = new EventSource("/events");
  let first = true;
  events.addEventListener("change", async () => {
    if (first) { first = false; return; }  // the table as the page was rendered
    const address = new URL(table.dataset.live, window.location.origin);
    address.searchParams.set("part", "table");
    const response = await fetch(address, { credentials: "same-origin" });
    if (response.ok) {
      table.innerHTML = await response.text();
      table.dataset.updated = String(Date.now());
    }
  });
}

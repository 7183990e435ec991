// A one-time sign-in link carries its code after '#': a browser never sends that part to a server, and
// `pincer open` hands it to the browser in a private file, never on a command line. The code is taken
// out of the address at once, then traded for the HttpOnly cookie.
"use strict";

document.addEventListener("DOMContentLoaded", async () => {
  const said = document.getElementById("login-status");
  const code = new URLSearchParams(location.hash.slice(1)).get("code") || "";
  history.replaceState(null, "", "/login");
  if (!code) {
    said.textContent = "This sign-in link has no code. Run `pincer open` again for a new one.";
    return;
  }
  const response = await fetch("/login", {
    method: "POST", credentials: "same-origin", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ code }),
  }).catch(() => null);
  if (response && response.ok) { location.replace("/"); return; }
  said.textContent = "This sign-in link was used already or has expired. Run `pincer open` again for a new one.";
  said.classList.add("error");
});

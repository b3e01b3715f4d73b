locals {
  party_names = slice(["alice", "bob", "carol", "dave"], 0, var.party_count)

  # Deterministic private addresses, so that `ppfs pki init` can be run (and the
  # gateway's config written) before `terraform apply`.
  party_ips  = [for i in range(var.party_count) : cidrhost(var.party_subnet_prefix, 10 + i)]
  gateway_ip = cidrhost(var.gateway_subnet_prefix, 10)

  parties = {
    for i, name in local.party_names : name => {
      index      = i
      private_ip = local.party_ips[i]
      mpc_port   = var.mpc_port_base + i * var.mpc_ports_per_party
    }
  }

  # each party's range of mpc_ports_per_party ports (one per job, in rotation), all parties'
  # ranges side by side
  mpc_port_range = "${var.mpc_port_base}-${var.mpc_port_base + var.party_count * var.mpc_ports_per_party - 1}"

  key_vault_name   = element(split("/", var.key_vault_id), 8)
  key_vault_uri    = "https://${local.key_vault_name}.vault.azure.net"
  acr_login_server = var.acr_id == null ? "" : "${lower(element(split("/", var.acr_id), 8))}.azurecr.io"

  gateway_dns_label = coalesce(var.gateway_dns_label, var.name_prefix)
  gateway_fqdn      = "${local.gateway_dns_label}.${var.location}.cloudapp.azure.com"

  common_tags = merge(var.tags, { "ppfs-deployment" = var.name_prefix, "ppfs-security" = var.security })
}

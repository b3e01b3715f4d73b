output "gateway_public_ip" {
  description = "Public IP of the gateway (HTTPS from allowed_https_cidrs only)."
  value       = azurerm_public_ip.gateway.ip_address
}

output "gateway_url" {
  description = "Base URL of the gateway's REST API (HTTPS with the certificate from make-secrets.sh --https-name <gateway_fqdn>)."
  value       = var.gateway_https_port == 443 ? "https://${local.gateway_fqdn}" : "https://${local.gateway_fqdn}:${var.gateway_https_port}"
}

output "gateway_fqdn" {
  description = "DNS name of the gateway's public IP (known before apply: <label>.<location>.cloudapp.azure.com)."
  value       = local.gateway_fqdn
}

output "gateway_private_ip" {
  description = "Private IP of the gateway (the only source allowed to reach the parties' gRPC)."
  value       = local.gateway_ip
}

output "party_private_ips" {
  description = "Private IP per party name, e.g. { alice = \"10.42.1.10\", ... }."
  value       = { for name, p in local.parties : name => p.private_ip }
}

output "mpc_addresses" {
  description = "host:port of each party's MPC engine, in party order (the MP-SPDZ HOSTS lines)."
  value       = [for name in local.party_names : "${local.parties[name].private_ip}:${local.parties[name].mpc_port}"]
}

output "party_grpc_addresses" {
  description = "host:port of each party's control plane, in party order (for the gateway's config)."
  value       = [for ip in local.party_ips : "${ip}:${var.grpc_port}"]
}

output "vm_principal_ids" {
  description = "Managed identity principal ID per VM (parties and gateway)."
  value       = local.vm_principals
}

output "key_vault_secret_names" {
  description = "The Key Vault secret each VM reads (upload each role's `ppfs pki init` folder there before the VMs boot)."
  value       = { for name in keys(local.vm_principals) : name => "${var.secret_prefix}-${name}" }
  sensitive   = true
}

output "vnet_id" {
  description = "Resource ID of the VNet."
  value       = azurerm_virtual_network.this.id
}

terraform {
  required_version = ">= 1.9.0, < 2.0.0"

  required_providers {
    azurerm = {
      source  = "hashicorp/azurerm"
      version = ">= 4.0.0, < 5.0.0"
    }
  }
}

provider "azurerm" {
  features {}
}

module "ppfs" {
  source = "../.."

  name_prefix          = var.name_prefix
  location             = var.location
  resource_group_name  = var.resource_group_name
  party_count          = var.party_count
  security             = var.security
  allowed_https_cidrs  = var.allowed_https_cidrs
  ssh_allowed_cidrs    = var.ssh_allowed_cidrs
  admin_ssh_public_key = var.admin_ssh_public_key
  party_image          = var.party_image
  gateway_image        = var.gateway_image
  acr_id               = var.acr_id
  key_vault_id         = var.key_vault_id
  tags                 = { project = "ppfs" }

  # each party's own administrator (optional; a party not listed takes admin_ssh_public_key)
  party_admin_ssh_public_keys = var.party_admin_ssh_public_keys
}

output "gateway_url" {
  description = "Base URL of the gateway."
  value       = module.ppfs.gateway_url
}

output "party_private_ips" {
  description = "Private IP per party."
  value       = module.ppfs.party_private_ips
}

# Network: one VNet, a party subnet and a gateway subnet, each behind its own NSG.
#
# Party NSG (inbound):  MPC ports      only from the party private IPs to the party private IPs
#                       gRPC           only from the gateway's private IP
#                       SSH            only from ssh_allowed_cidrs (if any)
#                       everything else denied (this also overrides AllowVnetInBound).
# Gateway NSG (inbound): HTTPS         only from allowed_https_cidrs
#                       SSH            only from ssh_allowed_cidrs (if any)
#                       everything else denied.

resource "azurerm_virtual_network" "this" {
  name                = "${var.name_prefix}-vnet"
  location            = var.location
  resource_group_name = var.resource_group_name
  address_space       = [var.address_space]
  tags                = local.common_tags
}

resource "azurerm_subnet" "parties" {
  name                            = "${var.name_prefix}-parties"
  resource_group_name             = var.resource_group_name
  virtual_network_name            = azurerm_virtual_network.this.name
  address_prefixes                = [var.party_subnet_prefix]
  default_outbound_access_enabled = true
  service_endpoints               = ["Microsoft.KeyVault"]
}

resource "azurerm_subnet" "gateway" {
  name                            = "${var.name_prefix}-gateway"
  resource_group_name             = var.resource_group_name
  virtual_network_name            = azurerm_virtual_network.this.name
  address_prefixes                = [var.gateway_subnet_prefix]
  default_outbound_access_enabled = true
  service_endpoints               = ["Microsoft.KeyVault"]
}

resource "azurerm_network_security_group" "parties" {
  name                = "${var.name_prefix}-parties-nsg"
  location            = var.location
  resource_group_name = var.resource_group_name
  tags                = local.common_tags
}

resource "azurerm_network_security_rule" "parties_mpc" {
  name                         = "allow-mpc-between-parties"
  description                  = "MPC engine traffic, party to party only (ports published 1:1)."
  priority                     = 100
  direction                    = "Inbound"
  access                       = "Allow"
  protocol                     = "Tcp"
  source_port_range            = "*"
  destination_port_range       = local.mpc_port_range
  source_address_prefixes      = local.party_ips
  destination_address_prefixes = local.party_ips
  resource_group_name          = var.resource_group_name
  network_security_group_name  = azurerm_network_security_group.parties.name
}

resource "azurerm_network_security_rule" "parties_grpc" {
  name                         = "allow-grpc-from-gateway"
  description                  = "Control plane (mutual TLS gRPC): from the gateway only."
  priority                     = 110
  direction                    = "Inbound"
  access                       = "Allow"
  protocol                     = "Tcp"
  source_port_range            = "*"
  destination_port_range       = tostring(var.grpc_port)
  source_address_prefix        = local.gateway_ip
  destination_address_prefixes = local.party_ips
  resource_group_name          = var.resource_group_name
  network_security_group_name  = azurerm_network_security_group.parties.name
}

resource "azurerm_network_security_rule" "parties_ssh" {
  count                        = length(var.ssh_allowed_cidrs) > 0 ? 1 : 0
  name                         = "allow-ssh-admin"
  description                  = "Administration from ssh_allowed_cidrs."
  priority                     = 200
  direction                    = "Inbound"
  access                       = "Allow"
  protocol                     = "Tcp"
  source_port_range            = "*"
  destination_port_range       = "22"
  source_address_prefixes      = var.ssh_allowed_cidrs
  destination_address_prefixes = local.party_ips
  resource_group_name          = var.resource_group_name
  network_security_group_name  = azurerm_network_security_group.parties.name
}

resource "azurerm_network_security_rule" "parties_deny" {
  name                        = "deny-all-other-inbound"
  description                 = "Overrides the default AllowVnetInBound and AllowAzureLoadBalancerInBound."
  priority                    = 4096
  direction                   = "Inbound"
  access                      = "Deny"
  protocol                    = "*"
  source_port_range           = "*"
  destination_port_range      = "*"
  source_address_prefix       = "*"
  destination_address_prefix  = "*"
  resource_group_name         = var.resource_group_name
  network_security_group_name = azurerm_network_security_group.parties.name
}

resource "azurerm_network_security_group" "gateway" {
  name                = "${var.name_prefix}-gateway-nsg"
  location            = var.location
  resource_group_name = var.resource_group_name
  tags                = local.common_tags
}

resource "azurerm_network_security_rule" "gateway_https" {
  name                        = "allow-https-from-clients"
  description                 = "The REST API, from allowed_https_cidrs only."
  priority                    = 100
  direction                   = "Inbound"
  access                      = "Allow"
  protocol                    = "Tcp"
  source_port_range           = "*"
  destination_port_range      = tostring(var.gateway_https_port)
  source_address_prefixes     = var.allowed_https_cidrs
  destination_address_prefix  = local.gateway_ip
  resource_group_name         = var.resource_group_name
  network_security_group_name = azurerm_network_security_group.gateway.name
}

resource "azurerm_network_security_rule" "gateway_ssh" {
  count                       = length(var.ssh_allowed_cidrs) > 0 ? 1 : 0
  name                        = "allow-ssh-admin"
  description                 = "Administration from ssh_allowed_cidrs."
  priority                    = 200
  direction                   = "Inbound"
  access                      = "Allow"
  protocol                    = "Tcp"
  source_port_range           = "*"
  destination_port_range      = "22"
  source_address_prefixes     = var.ssh_allowed_cidrs
  destination_address_prefix  = local.gateway_ip
  resource_group_name         = var.resource_group_name
  network_security_group_name = azurerm_network_security_group.gateway.name
}

resource "azurerm_network_security_rule" "gateway_deny" {
  name                        = "deny-all-other-inbound"
  description                 = "Overrides the default AllowVnetInBound and AllowAzureLoadBalancerInBound."
  priority                    = 4096
  direction                   = "Inbound"
  access                      = "Deny"
  protocol                    = "*"
  source_port_range           = "*"
  destination_port_range      = "*"
  source_address_prefix       = "*"
  destination_address_prefix  = "*"
  resource_group_name         = var.resource_group_name
  network_security_group_name = azurerm_network_security_group.gateway.name
}

resource "azurerm_subnet_network_security_group_association" "parties" {
  subnet_id                 = azurerm_subnet.parties.id
  network_security_group_id = azurerm_network_security_group.parties.id
}

resource "azurerm_subnet_network_security_group_association" "gateway" {
  subnet_id                 = azurerm_subnet.gateway.id
  network_security_group_id = azurerm_network_security_group.gateway.id
}
